"""The classic suite's vocabulary and contract: seven defect types over two tables, the five keys.

The column order is the classic suite's (CONFORMANCE §1-2); `validate_contract` checks the classic
contract strictly: its five keys and nothing else (`kernel.contract.check_core`).
"""
from __future__ import annotations

from typing import Any

from ...kernel.contract import check_core

DEFECT_TYPES: tuple[str, ...] = (
    "duplicate_key", "missing_value", "invalid_value", "orphan_reference",
    "out_of_range", "wrong_currency", "out_of_window",
)
COLUMNS: dict[str, tuple[str, ...]] = {
    "orders": ("order_id", "customer_id", "amount", "currency", "status", "order_date"),
    "customers": ("customer_id", "email", "country", "signup_date"),
}
TABLES = tuple(COLUMNS)
KEY_COLUMNS = {"orders": "order_id", "customers": "customer_id"}  # the column that names a row
CONTRACT_KEYS = ("reporting_window", "orders", "customers", "limits", "defect_types")


def validate_contract(doc: Any, where: str = "contract") -> dict:
    """Check a classic contract document; return it unchanged or raise ContractError."""
    return check_core(doc, where, CONTRACT_KEYS, COLUMNS, DEFECT_TYPES)
