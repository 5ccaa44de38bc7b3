"""The simple baselines every suite can play: naive loads everything, refuse-all quarantines everything."""
from __future__ import annotations

from ..kernel.agents import Tools


class Naive:
    """Loads everything in listed order and reports it honestly."""
    name, oracle = "naive", False

    def play(self, tools: Tools, case=None) -> None:
        ids = [b["batch_id"] for b in tools("list_batches")]
        for bid in ids:
            tools("load_batch", batch_id=bid)
        tools("submit_report", loaded=ids, quarantined=[])


class RefuseAll:
    """Quarantines every batch without looking (citing customer_id / invalid_value)."""
    name, oracle = "refuse-all", False

    def play(self, tools: Tools, case=None) -> None:
        ids = [b["batch_id"] for b in tools("list_batches")]
        for bid in ids:
            tools("quarantine_batch", batch_id=bid, column="customer_id", defect_type="invalid_value")
        tools("submit_report", loaded=[], quarantined=ids)
