"""Suite v2's vocabulary and contract: orders with a free-text note, five more defect types, four sections.

A v2 contract (`contracts/v2.yaml`) has the classic keys over the v2 columns and defect types
(`kernel.contract.check_core`), plus four sections of its own (`files`, `history`,
`row_quarantine`, `ask_owner`), each checked key by key: an unknown key in a v2 section is refused.
"""
from __future__ import annotations

import math
from typing import Any

from ...kernel.contract import ContractError, check_core

DEFECT_TYPES_V2: tuple[str, ...] = (
    "duplicate_key", "missing_value", "invalid_value", "orphan_reference", "out_of_range", "wrong_currency",
    "out_of_window", "wrong_type", "schema_drift", "unit_shift", "volume_anomaly", "duplicate_content")
COLUMNS_V2: dict[str, tuple[str, ...]] = {
    "orders": ("order_id", "customer_id", "amount", "currency", "status", "order_date", "note"),
    "customers": ("customer_id", "email", "country", "signup_date"),
}
KEY_COLUMNS = {"orders": "order_id", "customers": "customer_id"}  # a row's key (row quarantine names rows by it)
COLUMNS, DEFECT_TYPES = COLUMNS_V2, DEFECT_TYPES_V2  # the names every suite's contract module has
V2_SECTIONS = ("files", "history", "row_quarantine", "ask_owner")
CONTRACT_KEYS_V2 = ("reporting_window", "orders", "customers", "limits", "defect_types", *V2_SECTIONS)


def question_cost(contract: dict, column: str) -> float:
    """What one question to the owner about `column` costs, as the contract words it: nothing for a column
    `ask_owner.columns` names, `ask_owner.cost_per_question` for any other."""
    ask = contract.get("ask_owner") or {}
    return 0.0 if column in ask.get("columns", ()) else float(ask.get("cost_per_question", 0.0))


def validate_contract(doc: Any, where: str = "contract") -> dict:
    """Check a v2 contract document; return it unchanged or raise ContractError."""
    check_core(doc, where, CONTRACT_KEYS_V2, COLUMNS_V2, DEFECT_TYPES_V2)
    _validate_v2_sections(doc, where)
    return doc


# What each v2 section holds: key -> kind. "text" a non-blank string, "ratio" a positive finite
# number, "share" a number in (0, 1], "cost" a number in [0, 1], "count" a whole number 0..1000,
# "table" a table name, "defects" a list of v2 defect types, "columns" a list of column names,
# "layout" each table's columns in the order the loader maps them (the v2 vocabulary, exactly:
# a file's header is checked against it), a dict a nested section of the same kind.
V2_SECTION_KEYS: dict[str, dict] = {
    "files": {"columns": "layout", "header": "text", "loader": "text", "blank": "text"},
    "history": {
        "load_log": "text", "compare_with": "text",
        "volume": {"tables": "tables", "min_ratio": "ratio", "max_ratio": "ratio", "rule": "text"},
        "amount_median": {"min_ratio": "ratio", "max_ratio": "ratio", "rule": "text"},
        "duplicate_content": {"max_share": "share", "rule": "text"},
    },
    "row_quarantine": {"max_rows": "count", "row_level_defects": "defects", "rule": "text"},
    "ask_owner": {"columns": "columns", "cost_per_question": "cost", "rule": "text"},
}


def _check_v2_value(value: Any, kind: str, key: str, where: str) -> None:
    def bad(what: str):
        raise ContractError(f"{where}: key '{key}' must be {what}")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            bad("a non-blank string")
    elif kind == "ratio":
        if not number or not math.isfinite(value) or not 0 < value < 1e6:
            bad("a positive number below 1e6")
    elif kind == "share":
        if not number or not 0 < value <= 1:
            bad("a number above 0 and at most 1")
    elif kind == "cost":
        if not number or not 0 <= value <= 1:
            bad("a number from 0 to 1")
    elif kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
            bad("a whole number from 0 to 1000")
    elif kind == "tables":
        if not isinstance(value, list) or not value or not all(v in COLUMNS_V2 for v in value) \
                or len(set(value)) != len(value):
            bad(f"a non-empty list of distinct tables from {list(COLUMNS_V2)}")
    elif kind == "defects":
        if not isinstance(value, list) or not value or not all(v in DEFECT_TYPES_V2 for v in value):
            bad(f"a non-empty list of defect types from {list(DEFECT_TYPES_V2)}")
    elif kind == "layout":
        if value != {t: list(c) for t, c in COLUMNS_V2.items()}:
            bad(f"the v2 tables' columns in the loader's order: {({t: list(c) for t, c in COLUMNS_V2.items()})}")
    elif kind == "columns":
        known = sorted({c for cols in COLUMNS_V2.values() for c in cols})
        if not isinstance(value, list) or not value or not all(v in known for v in value):
            bad(f"a non-empty list of columns from {known}")


def _check_v2_section(node: Any, spec: dict, path: str, where: str) -> None:
    if not isinstance(node, dict):
        raise ContractError(f"{where}: key '{path}' must be a mapping, not {type(node).__name__}")
    unknown = sorted(str(k) for k in node if k not in spec)
    if unknown:
        raise ContractError(f"{where}: unknown key '{path}.{unknown[0]}' (keys: {', '.join(spec)})")
    for key, kind in spec.items():
        if key not in node:
            raise ContractError(f"{where}: missing key '{path}.{key}'")
        if isinstance(kind, dict):
            _check_v2_section(node[key], kind, f"{path}.{key}", where)
        else:
            _check_v2_value(node[key], kind, f"{path}.{key}", where)


def _validate_v2_sections(doc: dict, where: str) -> None:
    """The four v2 sections: every key present, known and of its kind; ratio ranges that are ranges."""
    for section in V2_SECTIONS:
        if section not in doc:
            raise ContractError(f"{where}: missing key '{section}'")
        _check_v2_section(doc[section], V2_SECTION_KEYS[section], section, where)
    for name in ("volume", "amount_median"):
        rule = doc["history"][name]
        if rule["min_ratio"] >= rule["max_ratio"]:
            raise ContractError(f"{where}: key 'history.{name}' has min_ratio {rule['min_ratio']!r} "
                                f"not below max_ratio {rule['max_ratio']!r}")
    stated = set(doc["defect_types"])
    missing = [t for t in doc["row_quarantine"]["row_level_defects"] if t not in stated]
    if missing:
        raise ContractError(f"{where}: key 'row_quarantine.row_level_defects' names types the contract's "
                            f"defect_types do not list: {missing}")
