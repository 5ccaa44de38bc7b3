"""The contract's rules as data: which defect each clause of a contract document detects.

Kept apart from `schemas.py` (which builds pandera schemas from them) so that code which only
needs to name or select rules (variants, agents, the CLI) does not import pandas and pandera.
"""
from __future__ import annotations

from typing import Iterable

from ...kernel.contract import CORE_RULES, Rule

# Every rule the classic contract states, in the order a careful agent checks them: the contract core's.
CATALOGUE: tuple[Rule, ...] = CORE_RULES


def rules_for(contract: dict, table: str, without: Iterable[str] = ()) -> list[Rule]:
    """The rules a contract states for `table` (a rule needs its column in the document)."""
    skip = set(without)
    stated = contract.get(table) or {}
    return [r for r in CATALOGUE if r.table == table and r.column in stated and r.key not in skip]


RULE_KEYS = tuple(r.key for r in CATALOGUE)
