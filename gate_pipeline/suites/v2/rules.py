"""The v2 contract's rules as data: which defect each clause detects, and at what level.

Row rules judge one row (the classic eleven, `wrong_type` for an amount that is not a plain
decimal number, `invalid_value` for an e-mail that is not an address); a file rule judges the
header (`schema_drift`); history rules judge the batch against the earlier nights
(`volume_anomaly` of orders and of customers, `unit_shift`, `duplicate_content`). Keys are
`table.column.defect_type` as in the classic catalogue (`rules.py`, unchanged); a file rule's
column is `header` (its citation may name any column of the table).
"""
from __future__ import annotations

from typing import Iterable

from ...kernel.contract import Rule

ROW, FILE, HISTORY = "row", "file", "history"


# Every rule the v2 contract states, in the order careful-v2 checks them.
CATALOGUE_V2: tuple[Rule, ...] = (
    Rule("customers", "header", "schema_drift", level=FILE),
    Rule("customers", "customer_id", "duplicate_key", True),
    Rule("customers", "email", "missing_value"),
    Rule("customers", "email", "invalid_value"),
    Rule("customers", "country", "invalid_value"),
    Rule("customers", "signup_date", "out_of_window"),
    Rule("customers", "customer_id", "volume_anomaly", True, level=HISTORY),
    Rule("orders", "header", "schema_drift", level=FILE),
    Rule("orders", "order_id", "duplicate_key", True),
    Rule("orders", "amount", "missing_value"),
    Rule("orders", "amount", "wrong_type"),
    Rule("orders", "amount", "out_of_range"),
    Rule("orders", "currency", "wrong_currency"),
    Rule("orders", "status", "invalid_value"),
    Rule("orders", "order_date", "out_of_window"),
    Rule("orders", "customer_id", "orphan_reference", True),
    Rule("orders", "order_id", "volume_anomaly", True, level=HISTORY),
    Rule("orders", "amount", "unit_shift", True, level=HISTORY),
    Rule("orders", "order_id", "duplicate_content", True, level=HISTORY),
)
RULE_KEYS_V2 = tuple(r.key for r in CATALOGUE_V2)
HISTORY_SECTION = {"volume_anomaly": "volume", "unit_shift": "amount_median", "duplicate_content": "duplicate_content"}


def stated(rule: Rule, contract: dict) -> bool:
    """Whether the contract document states the rule (its clause, and its defect type)."""
    if rule.defect_type not in contract.get("defect_types", ()):
        return False
    if rule.level == FILE:
        return "header" in (contract.get("files") or {})
    if rule.level == HISTORY:
        section = (contract.get("history") or {}).get(HISTORY_SECTION[rule.defect_type])
        if not section:
            return False
        return rule.table in section.get("tables", ()) if rule.defect_type == "volume_anomaly" else True
    return rule.column in (contract.get(rule.table) or {})


def rules_for(contract: dict, table: str, without: Iterable[str] = (), level: str | None = None) -> list[Rule]:
    """The v2 rules a contract states for `table` (optionally of one level), catalogue order."""
    skip = set(without)
    return [r for r in CATALOGUE_V2 if r.table == table and r.key not in skip and (level is None or r.level == level)
            and stated(r, contract)]
