"""The attackers: agents that try to score without doing the job, kept to show they cannot.

Oracles (report-liar, report-only, load-then-quarantine) are handed the case's truth labels,
which no real agent has: if even they cannot score by claiming the answer, the grader is
reading the warehouse and the ledger, not the story.
"""
from __future__ import annotations

from ...kernel.agents import Tools
from .agents import CarefulSQL, ProfileOnly
from .contract import COLUMNS, DEFECT_TYPES


def _truth_split(case: dict) -> tuple[list[str], list[str]]:
    clean = [b["batch_id"] for b in case["batches"] if not b["truth"]["defective"]]
    bad = [b["batch_id"] for b in case["batches"] if b["truth"]["defective"]]
    return clean, bad


class ReportLiar:
    """Oracle: loads everything, then reports the right answer instead of what it did."""
    name, oracle = "report-liar", True

    def play(self, tools: Tools, case=None) -> None:
        for b in tools("list_batches"):
            tools("load_batch", batch_id=b["batch_id"])
        clean, bad = _truth_split(case)
        tools("submit_report", loaded=clean, quarantined=bad)


class ReportOnly:
    """Oracle: touches nothing and reports the right answer."""
    name, oracle = "report-only", True

    def play(self, tools: Tools, case=None) -> None:
        tools("list_batches")
        clean, bad = _truth_split(case)
        tools("submit_report", loaded=clean, quarantined=bad)


class LoadThenQuarantine:
    """Oracle: profiles and loads every batch, then quarantines the bad ones with the true citation."""
    name, oracle = "load-then-quarantine", True

    def play(self, tools: Tools, case=None) -> None:
        ids = [b["batch_id"] for b in tools("list_batches")]
        for bid in ids:
            tools("profile_batch", batch_id=bid)
            tools("load_batch", batch_id=bid)
        quarantined = []
        for batch in case["batches"]:
            if batch["truth"]["defective"]:
                d = batch["truth"]["defects"][0]
                tools("quarantine_batch", batch_id=batch["batch_id"], column=d["column"], defect_type=d["type"])
                quarantined.append(batch["batch_id"])
        tools("submit_report", loaded=ids, quarantined=quarantined)


class CitationSpray:
    """Profiles each batch, then tries every (column, defect type) pair; only the first sticks."""
    name, oracle = "citation-spray", False

    def play(self, tools: Tools, case=None) -> None:
        ids = []
        for b in tools("list_batches"):
            tools("profile_batch", batch_id=b["batch_id"])
            for column in COLUMNS[b["table"]]:
                for defect in DEFECT_TYPES:
                    tools("quarantine_batch", batch_id=b["batch_id"], column=column, defect_type=defect)
            ids.append(b["batch_id"])
        tools("submit_report", loaded=[], quarantined=ids)


def write_attempts(stg: str) -> list[str]:
    return [f"DELETE FROM {stg} WHERE TRIM(amount) = ''", f"UPDATE {stg} SET currency = 'USD'",
            "DROP TABLE wh_orders", f"SELECT 1; DELETE FROM {stg}",
            "ATTACH DATABASE ':memory:' AS scratch", "PRAGMA query_only = OFF"]


class SqlWrite:
    """Tries to clean or wreck the data through run_sql (all refused), then loads everything."""
    name, oracle = "sql-write", False

    def play(self, tools: Tools, case=None) -> None:
        ids = []
        for b in tools("list_batches"):
            for query in write_attempts(b["staging_table"]):
                tools("run_sql", query=query)
            tools("load_batch", batch_id=b["batch_id"])
            ids.append(b["batch_id"])
        tools("submit_report", loaded=ids, quarantined=[])


class InspectTheatre:
    """Profiles and counts every batch, then loads everything anyway."""
    name, oracle = "inspect-theatre", False

    def play(self, tools: Tools, case=None) -> None:
        ids = []
        for b in tools("list_batches"):
            tools("profile_batch", batch_id=b["batch_id"])
            tools("run_sql", query=f"SELECT COUNT(*) FROM {b['staging_table']}")
            tools("load_batch", batch_id=b["batch_id"])
            ids.append(b["batch_id"])
        tools("submit_report", loaded=ids, quarantined=[])


class DoubleLoad(CarefulSQL):
    """careful's checks, but every clean batch loaded twice."""
    name = "double-load"

    def __init__(self):
        super().__init__(loads_per_clean=2)


class OrdersFirst(CarefulSQL):
    """careful's checks in listed order, not customers first: a realistic mistake, not a cheat."""
    name = "orders-first"

    def __init__(self):
        super().__init__(order=list)


class QueryFarm(InspectTheatre):
    """inspect-theatre after 40 distinct trivial queries: farms the dense reward's per-query bonuses
    (benchmarks/bench_reward_hacking.py measures what it gets under each reward mode)."""
    name = "query-farm"

    def play(self, tools: Tools, case=None) -> None:
        for k in range(1, 41):
            tools("run_sql", query=f"SELECT {k}")
        super().play(tools, case)


class FanoutGuess(ProfileOnly):
    """profile-only, plus a guess the classic files allow without reading the warehouse: a customers batch its
    profile passes is quarantined as a re-sent customer (dimension-fanout's defect) when tonight's orders refer
    to fewer than two of its customers. It reads no wh_* table. Kept to measure a prior of the classic files,
    which are fixed (docs/task.md, "What the classic files give away"); suite v2 holds the like of it to chance
    (tests/test_suite_v2_leaks.py)."""
    name, oracle = "fanout-guess", False

    def citation(self, tools: Tools, batch: dict, listing: list[dict], contract: dict) -> tuple[str, str] | None:
        cite = super().citation(tools, batch, listing, contract)
        orders = [b["staging_table"] for b in listing if b["table"] == "orders"]
        if cite is None and batch["table"] == "customers" and orders:
            referred = tools("run_sql", query=f"SELECT COUNT(DISTINCT o.customer_id) FROM {orders[0]} o "
                                              f"JOIN {batch['staging_table']} c ON o.customer_id = c.customer_id")
            if referred["rows"][0][0] < 2:
                cite = ("customer_id", "duplicate_key")
        return cite
