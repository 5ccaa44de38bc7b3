"""The contract's rules as data: which defect each clause of a contract document detects.

Kept apart from `schemas.py` (which builds pandera schemas from them) so that code which only
needs to name or select rules (variants, agents, the CLI) does not import pandas and pandera.
"""
from __future__ import annotations

from typing import Iterable

from ...kernel.contract import Rule

# Every rule the classic contract states, in the order a careful agent checks them.
CATALOGUE: tuple[Rule, ...] = (
    Rule("customers", "customer_id", "duplicate_key", True),
    Rule("customers", "email", "missing_value"),
    Rule("customers", "country", "invalid_value"),
    Rule("customers", "signup_date", "out_of_window"),
    Rule("orders", "order_id", "duplicate_key", True),
    Rule("orders", "amount", "missing_value"),
    Rule("orders", "amount", "out_of_range"),
    Rule("orders", "currency", "wrong_currency"),
    Rule("orders", "status", "invalid_value"),
    Rule("orders", "order_date", "out_of_window"),
    Rule("orders", "customer_id", "orphan_reference", True),
)


def rules_for(contract: dict, table: str, without: Iterable[str] = ()) -> list[Rule]:
    """The rules a contract states for `table` (a rule needs its column in the document)."""
    skip = set(without)
    stated = contract.get(table) or {}
    return [r for r in CATALOGUE if r.table == table and r.column in stated and r.key not in skip]
