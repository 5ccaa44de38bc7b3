"""Pandera schemas built from a contract document, one named check per contract rule.

Each rule of the contract becomes one pandera check whose name is the defect type it
detects, so a failure case reads as a citation: (column, defect type). The values come from
the document (`limits`, `reporting_window`); which rules exist comes from the columns the
document states. Rules that need the warehouse (uniqueness, the customer reference) take
the warehouse keys the caller fetched. Used by the `careful` baseline (lazily, on each batch
it fetched through `run_sql`) and by the Dagster asset checks.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

os.environ.setdefault("DISABLE_PANDERA_IMPORT_WARNING", "True")
import pandas as pd  # noqa: E402
import pandera.pandas as pa  # noqa: E402

from ...kernel.schemas import table_schema  # noqa: E402
from .contract import COLUMNS  # noqa: E402
from .rules import CATALOGUE, Rule, rules_for  # noqa: E402,F401  (re-exported)


def _text(s: pd.Series) -> pd.Series:
    return s.astype(object).where(s.notna(), None)


def _present(s: pd.Series) -> pd.Series:
    return s.notna() & (s.fillna("").astype(str).str.strip() != "")


def _number(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s.fillna("").astype(str).str.strip(), errors="coerce")


def _check_fn(rule: Rule, contract: dict, keys: dict[str, set]) -> Callable:
    limits, window = contract["limits"], contract["reporting_window"]
    kind = rule.defect_type
    if kind == "duplicate_key":
        known = keys.get(rule.column, set())
        return lambda s: ~(s.duplicated(keep=False) | _text(s).isin(known))
    if kind == "orphan_reference":
        known = keys.get("customer_id", set())
        return lambda s: _text(s).isin(known)
    if kind == "missing_value":
        return _present
    if kind == "invalid_value":
        allowed = limits["allowed_status"] if rule.column == "status" else limits["allowed_countries"]
        return lambda s: _text(s).isin(allowed)
    if kind == "wrong_currency":
        return lambda s: _text(s).eq(limits["currency"]).fillna(False).astype(bool)
    if kind == "out_of_window":
        start, end = window["start"], window["end"]
        if rule.table == "customers":
            return lambda s: ~(s.notna() & (s.fillna("").astype(str) > end))
        return lambda s: ~(s.notna() & ((s.fillna("").astype(str) < start) | (s.fillna("").astype(str) > end)))
    if kind == "out_of_range":
        cap = limits["max_amount"]

        def amount_within_limits(df: pd.DataFrame) -> pd.Series:
            x = _number(df[rule.column])
            refund = df["status"].fillna("").astype(str) == "refunded"
            ok = (refund & (x >= -cap) & (x < 0)) | (~refund & (x > 0) & (x <= cap))
            return ok.fillna(False).astype(bool)
        return amount_within_limits
    raise ValueError(f"no check for {rule.key}")


def build_schema(contract: dict, table: str, warehouse_keys: dict[str, set] | None = None,
                 without: Iterable[str] = ()) -> pa.DataFrameSchema:
    """The pandera schema of one table under `contract`; checks are named by defect type."""
    keys = warehouse_keys or {}
    return table_schema(rules_for(contract, table, without), lambda rule: _check_fn(rule, contract, keys),
                        COLUMNS[table], f"{table}_contract")


def frame(rows: list, columns: Iterable[str]) -> pd.DataFrame:
    """A batch as a DataFrame of strings (None kept as missing)."""
    return pd.DataFrame(rows, columns=list(columns), dtype=object)


def failing_rules(schema: pa.DataFrameSchema, df: pd.DataFrame, rules: list[Rule]) -> tuple[list[Rule], pd.DataFrame | None]:
    """Validate lazily; the rules that failed (in rule order) and pandera's failure cases."""
    try:
        schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as exc:
        fc = exc.failure_cases
        failed = set(fc["check"].astype(str))
        hit = [r for r in rules if r.defect_type in failed]
        return hit, fc
    return [], None
