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

from ...kernel.contract import CORE_RULES, Rule

ROW, FILE, HISTORY = "row", "file", "history"


# Every rule the v2 contract states, in the order careful-v2 checks them.
AFTER_CORE = {"orders.amount.missing_value": Rule("orders", "amount", "wrong_type"),  # v2's row rules, each
              "customers.email.missing_value": Rule("customers", "email", "invalid_value")}  # after its core rule


def _with_v2_rules(table: str) -> tuple[Rule, ...]:
    """A table's rules of the contract core, with the file rule first and v2's row rules after their core rule."""
    out = [Rule(table, "header", "schema_drift", level=FILE)]
    for rule in CORE_RULES:
        if rule.table == table:
            out.append(rule)
            if rule.key in AFTER_CORE:
                out.append(AFTER_CORE[rule.key])
    return tuple(out)


CATALOGUE_V2: tuple[Rule, ...] = (
    *_with_v2_rules("customers"),
    Rule("customers", "customer_id", "volume_anomaly", True, level=HISTORY),
    *_with_v2_rules("orders"),
    Rule("orders", "order_id", "volume_anomaly", True, level=HISTORY),
    Rule("orders", "amount", "unit_shift", True, level=HISTORY),
    Rule("orders", "order_id", "duplicate_content", True, level=HISTORY),
)
RULE_KEYS_V2 = RULE_KEYS = tuple(r.key for r in CATALOGUE_V2)
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
