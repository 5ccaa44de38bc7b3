"""The frame of a contract's pandera schema: one named check per rule, as every suite builds it.

A suite says which rules a table has and what each checks (`check_of(rule)`: a function over the
column, or over the frame for a rule that reads two columns); the schema names every check after the
defect type it detects, so a failure case reads as a citation: (column, defect type). Imported only
by a suite's schemas module (pandas and pandera load with it).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

os.environ.setdefault("DISABLE_PANDERA_IMPORT_WARNING", "True")
import pandera.pandas as pa  # noqa: E402

from .contract import Rule  # noqa: E402


def table_schema(rules: Iterable[Rule], check_of: Callable[[Rule], Callable], columns: Iterable[str], name: str,
                 frame_rules: Iterable[str] = ("out_of_range",)) -> pa.DataFrameSchema:
    """The schema of one table: every column present and nullable, each rule one check named by its defect
    type, on its column (missing values checked too), or on the whole frame for `frame_rules`."""
    column_checks: dict[str, list] = {c: [] for c in columns}
    frame_checks = []
    whole = set(frame_rules)
    for rule in rules:
        fn = check_of(rule)
        if rule.defect_type in whole:
            frame_checks.append(pa.Check(fn, name=rule.defect_type))
        else:
            column_checks[rule.column].append(pa.Check(fn, name=rule.defect_type, ignore_na=False))
    schema_columns = {c: pa.Column(checks=checks, nullable=True, required=True) for c, checks in column_checks.items()}
    return pa.DataFrameSchema(schema_columns, checks=frame_checks, name=name, strict=False)
