"""oracle: handed the truth labels, it plays every case the way the rubric grades as right.

It exists to prove each case solvable at 1.0 (on every suite and at every size): it looks at
each batch (a profile), loads customers first, quarantines a batch the truth quarantines with
its first defect and cites the others, holds back the rows the truth names and loads the rest,
and reports what it did. It never asks the owner (it needs no answer). No real agent has labels.
"""
from __future__ import annotations

from .base import Tools, customers_first

LIST_ITEMS = 1000


def disposition_of(truth: dict) -> str:
    """A batch's disposition: a v2 label says it; a classic one is "quarantine" when defective."""
    return truth.get("disposition") or ("quarantine" if truth["defective"] else "load")


class Oracle:
    name, oracle = "oracle", True

    def inspect(self, tools: Tools, batch: dict) -> None:
        tools("profile_batch", batch_id=batch["batch_id"])

    def play(self, tools: Tools, case=None) -> None:
        truth = {b["batch_id"]: b["truth"] for b in case["batches"]}
        loaded, quarantined = [], []
        for batch in customers_first(tools("list_batches")):
            bid = batch["batch_id"]
            self.inspect(tools, batch)
            t = truth[bid]
            if disposition_of(t) == "quarantine":
                first, *rest = t["defects"]
                tools("quarantine_batch", batch_id=bid, column=first["column"], defect_type=first["type"])
                for d in rest:
                    tools("cite_defect", batch_id=bid, column=d["column"], defect_type=d["type"])
                quarantined.append(bid)
                continue
            for d in t["defects"]:
                keys = d.get("keys", [])
                for start in range(0, len(keys), LIST_ITEMS):
                    tools("quarantine_rows", batch_id=bid, keys=keys[start:start + LIST_ITEMS], column=d["column"],
                          defect_type=d["type"])
            tools("load_batch", batch_id=bid)
            loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)
