"""Pandera schemas built from a v2 contract, one named check per rule, at three levels.

- `header_schema`: the contract's columns of a table, strict and ordered; a file's header that
  fails it has drifted (`schema_drift`).
- `row_schema`: one check per row rule, named by the defect type it detects (as the classic
  `schemas.build_schema`), so pandera's failure cases read as citations with their rows. The
  warehouse rules take what the caller found in the warehouse: the batch's keys it already
  holds, the batch's customers it lacks. Values the contract owner accepted for the batch are
  allowed alongside the contract's lists.
- `history_schema`: the batch's figures against the earlier nights (row-count ratio, median
  amount ratio, share of rows repeating a warehouse row), one check per history rule, the
  bounds from the contract's `history` section.

`findings` applies all three to one batch and says which rules fail and on which rows;
careful-v2, the dense reward's gold rows and the Dagster asset checks all use it.

pandas keeps the checks' text as Arrow strings. Unless ARROW_DEFAULT_MEMORY_POOL says otherwise, or
pandas was loaded before this module, pyarrow allocates them with the system allocator, which returns
what the checks free (pyarrow's default pool keeps it, and a process stays as large as the largest
batch's checks made it: docs/performance.md section 10).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Iterable

os.environ.setdefault("DISABLE_PANDERA_IMPORT_WARNING", "True")
# pandas keeps text as Arrow strings, by default in pyarrow's mimalloc pool, which holds on to what the checks
# freed; the system allocator gives it back (read when pyarrow first loads, with pandas)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
import pandas as pd  # noqa: E402
import pandera.pandas as pa  # noqa: E402

from ...kernel.schemas import table_schema  # noqa: E402
from .contract import KEY_COLUMNS  # noqa: E402
from .rules import FILE, HISTORY, ROW, Rule, rules_for  # noqa: E402

BLANK = " \t\r\n"
DECIMAL = r"-?[0-9]+(\.[0-9]+)?"
EMAIL = r"[^@\s]+@[^@\s]+\.[^@\s]+"


def contract_columns(contract: dict, table: str) -> list[str]:
    """A table's columns as the contract lists them, in order (what a file's header must be): the v2
    contract's `files.columns`; a contract without it (the classic one) lists them in its table section."""
    layout = (contract.get("files") or {}).get("columns")
    return list(layout[table]) if layout else list(contract[table])


def _str(s: pd.Series) -> pd.Series:
    return s.fillna("").astype(str)


def _blank(s: pd.Series) -> pd.Series:
    return s.isna() | (_str(s).str.strip(BLANK) == "")


def _decimal(s: pd.Series) -> pd.Series:
    return _str(s).str.fullmatch(DECIMAL)


def header_schema(contract: dict, table: str) -> pa.DataFrameSchema:
    columns = {c: pa.Column(nullable=True, required=True) for c in contract_columns(contract, table)}
    return pa.DataFrameSchema(columns, strict=True, ordered=True, name=f"{table}_header")


def header_drifted(contract: dict, table: str, header: list[str]) -> bool:
    """Whether a file's header breaks the contract's columns (renamed, added, dropped or moved)."""
    if len(set(header)) != len(header):
        return True
    try:
        header_schema(contract, table).validate(pd.DataFrame(columns=header, dtype=object), lazy=True)
    except (pa.errors.SchemaErrors, pa.errors.SchemaError):
        return True
    return False


def _row_check(rule: Rule, contract: dict, keys: dict, accepted: dict):
    limits, window = contract["limits"], contract["reporting_window"]
    kind = rule.defect_type
    if kind == "duplicate_key":
        existing = keys.get("existing_keys", set())
        return lambda s: ~(s.duplicated(keep=False) | s.isin(existing))
    if kind == "orphan_reference":
        missing = keys.get("missing_customers", set())
        return lambda s: ~s.isin(missing)
    if kind == "missing_value":
        return lambda s: ~_blank(s)
    if kind == "wrong_type":
        return lambda s: _blank(s) | _decimal(s)
    if kind == "invalid_value" and rule.column == "email":
        return lambda s: _blank(s) | _str(s).str.fullmatch(EMAIL)
    if kind == "invalid_value":
        listed = limits["allowed_status"] if rule.column == "status" else limits["allowed_countries"]
        allowed = set(listed) | set(accepted.get(rule.column, ()))
        return lambda s: s.isin(allowed)
    if kind == "wrong_currency":
        allowed = {limits["currency"]} | set(accepted.get(rule.column, ()))
        return lambda s: s.isin(allowed)
    if kind == "out_of_window":
        start, end = window["start"], window["end"]
        if rule.table == "customers":
            return lambda s: ~(_str(s) > end)
        return lambda s: ~((_str(s) < start) | (_str(s) > end))
    if kind == "out_of_range":
        cap = limits["max_amount"]

        def amount_within_limits(df: pd.DataFrame) -> pd.Series:
            text = _str(df[rule.column])
            plain = text.str.fullmatch(DECIMAL)
            x = pd.to_numeric(text.where(plain), errors="coerce")
            refund = _str(df["status"]) == "refunded"
            ok = (refund & (x >= -cap) & (x < 0)) | (~refund & (x > 0) & (x <= cap))
            return (~plain | ok.fillna(False)).astype(bool)
        return amount_within_limits
    raise ValueError(f"no row check for {rule.key}")


def row_schema(contract: dict, table: str, keys: dict | None = None, without: Iterable[str] = (),
               accepted: dict | None = None) -> pa.DataFrameSchema:
    """The pandera schema of a table's row rules under `contract`; checks are named by defect type."""
    keys, accepted = keys or {}, accepted or {}
    return table_schema(rules_for(contract, table, without, ROW), lambda rule: _row_check(rule, contract, keys, accepted),
                        contract_columns(contract, table), f"{table}_rows")


@dataclass
class HistoryFigures:
    """A batch's figures beside the earlier nights' (None where there is nothing to compare)."""
    rows: int
    usual_rows: float | None = None
    median_amount: float | None = None
    usual_median: float | None = None
    repeated_rows: int | None = None

    def frame(self) -> pd.DataFrame:
        def ratio(a, b):
            return float("nan") if a is None or not b else a / b
        return pd.DataFrame({"rows_ratio": [ratio(self.rows, self.usual_rows)],
                             "median_ratio": [ratio(self.median_amount, self.usual_median)],
                             "repeat_share": [ratio(self.repeated_rows, self.rows)]}, dtype=float)


def history_schema(contract: dict, table: str, without: Iterable[str] = ()) -> pa.DataFrameSchema:
    """The history rules as checks on a one-row frame of ratios (a NaN ratio has nothing to compare with)."""
    hist = contract["history"] if "history" in contract else {}
    columns: dict[str, list] = {"rows_ratio": [], "median_ratio": [], "repeat_share": []}
    for rule in rules_for(contract, table, without, HISTORY):
        if rule.defect_type == "volume_anomaly":
            lo, hi = hist["volume"]["min_ratio"], hist["volume"]["max_ratio"]
            columns["rows_ratio"].append(pa.Check(lambda s, lo=lo, hi=hi: s.isna() | s.between(lo, hi),
                                                  name="volume_anomaly", ignore_na=False))
        elif rule.defect_type == "unit_shift":
            lo, hi = hist["amount_median"]["min_ratio"], hist["amount_median"]["max_ratio"]
            columns["median_ratio"].append(pa.Check(lambda s, lo=lo, hi=hi: s.isna() | s.between(lo, hi),
                                                    name="unit_shift", ignore_na=False))
        elif rule.defect_type == "duplicate_content":
            top = hist["duplicate_content"]["max_share"]
            columns["repeat_share"].append(pa.Check(lambda s, top=top: s.isna() | (s <= top),
                                                    name="duplicate_content", ignore_na=False))
    return pa.DataFrameSchema({c: pa.Column(float, checks=checks, nullable=True) for c, checks in columns.items()},
                              name=f"{table}_history")


def median_of_amounts(values) -> float | None:
    """The median of the amounts written as plain decimal numbers (what the unit_shift rule compares)."""
    s = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    plain = _str(s)[_decimal(s)]
    return float(statistics.median(pd.to_numeric(plain).tolist())) if len(plain) else None


@dataclass
class Findings:
    """What a batch breaks: per failing rule, the failing row positions (empty for a file or history rule)."""
    drifted: bool = False
    failures: list[tuple[Rule, list[int]]] = field(default_factory=list)
    failure_cases: pd.DataFrame | None = None

    @property
    def rules(self) -> list[Rule]:
        return [r for r, _ in self.failures]

    def bad_rows(self) -> set[int]:
        return {i for _, rows in self.failures for i in rows}


def _failing(schema: pa.DataFrameSchema, df: pd.DataFrame, rules: list[Rule], rows: bool):
    try:
        schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as exc:
        fc = exc.failure_cases
        out = []
        for rule in rules:
            hit = fc[fc["check"].astype(str) == rule.defect_type]
            if rule.level == ROW and rule.defect_type != "out_of_range":
                hit = hit[hit["column"].astype(str) == rule.column]
            if len(hit):
                out.append((rule, sorted({int(i) for i in hit["index"].dropna()}) if rows else []))
        return out, fc
    return [], None


def findings(contract: dict, table: str, header: list[str], df: pd.DataFrame | None, keys: dict | None = None,
             history: HistoryFigures | None = None, without: Iterable[str] = (), accepted: dict | None = None) -> Findings:
    """The rules a batch breaks under the contract: the header first (a drifted file is judged by that
    alone), then its rows (`df`, the file's rows as strings) and its history figures."""
    out = Findings()
    file_rules = rules_for(contract, table, without, FILE)
    if file_rules and header_drifted(contract, table, header):
        out.drifted = True
        out.failures.append((file_rules[0], []))
        return out
    cases = []
    row_rules = rules_for(contract, table, without, ROW)
    if df is not None and row_rules:
        failed, fc = _failing(row_schema(contract, table, keys, without, accepted), df, row_rules, True)
        out.failures += failed
        if fc is not None:
            cases.append(fc)
    hist_rules = rules_for(contract, table, without, HISTORY)
    if history is not None and hist_rules:
        failed, fc = _failing(history_schema(contract, table, without), history.frame(), hist_rules, False)
        out.failures += failed
        if fc is not None:
            cases.append(fc)
    out.failures.sort(key=lambda f: rules_for(contract, table, without).index(f[0]))
    out.failure_cases = pd.concat(cases, ignore_index=True) if cases else None
    return out


def disposition(contract: dict, found: Findings) -> str:
    """What the contract's row-quarantine policy makes of a batch's findings: "load", "rows" (quarantine
    those rows, load the rest) or "quarantine" (the whole batch)."""
    if not found.failures:
        return "load"
    policy = contract.get("row_quarantine")
    if not policy or found.drifted:
        return "quarantine"
    row_level = set(policy["row_level_defects"])
    if all(r.level == ROW and r.defect_type in row_level for r in found.rules) \
            and len(found.bad_rows()) <= policy["max_rows"]:
        return "rows"
    return "quarantine"


CHUNK_ROWS = 500  # rows careful-v2 holds as Python values before each column's become one chunk (`column_chunk`)


def column_chunk(values: list):
    """Some consecutive values of a file's column as a frame keeps them: text in pandas' string dtype (with
    pyarrow, one Arrow array: no Python object a value), any other values (a NULL, a number) as they are."""
    if all(type(v) is str for v in values):
        return pd.array(values, dtype="str")
    return list(values)


def frame_of(columns: list[str], values: list[list], rows: int) -> pd.DataFrame:
    """A file's rows as a DataFrame, its header as columns: `values`, each column's chunks in row order
    (`column_chunk`'s, `rows` values in all). A column whose chunks are all text is pandas' string dtype,
    its chunks joined without a copy; any other is object. The checks read either alike (each reads a column
    as text first, `_str`), as gate's side reads its frames from the file (`gold.staged_frame`)."""
    data = {}
    for i, chunks in enumerate(values):
        if chunks and not any(isinstance(c, list) for c in chunks):
            data[i] = pd.concat([pd.Series(c, copy=False) for c in chunks], ignore_index=True)
        else:
            data[i] = pd.Series([v for c in chunks for v in c], dtype=object)
    short = [columns[i] for i, series in data.items() if len(series) != rows]
    if short:  # never padded with missing values: a column read short is the reader's error, not the batch's
        raise ValueError(f"frame_of: {len(short)} column(s) ({short[0]} first) do not hold {rows} values")
    df = pd.DataFrame(data, index=pd.RangeIndex(rows))
    df.columns = list(columns)
    return df


__all__ = ["CHUNK_ROWS", "KEY_COLUMNS", "Findings", "HistoryFigures", "column_chunk", "contract_columns", "disposition",
           "findings", "frame_of", "header_drifted", "header_schema", "history_schema", "median_of_amounts", "row_schema"]
