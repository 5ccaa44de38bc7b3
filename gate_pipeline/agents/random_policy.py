"""A seeded random-tool policy: the floor the dense reward is calibrated against.

Why it exists: F003 promises that random exploration earns little step reward and careful
inspection a lot more; measuring that needs a policy that picks tools and plausible arguments
at random (real batch ids, staging tables, columns and defect types it has seen; simple
SELECTs), with no strategy. Each episode's calls come from `Random(seed, the episode's seed)`
(`tools.episode_seed`, fixed by the case), so a case gets the same calls on every surface,
whatever else the process played before it.
"""
from __future__ import annotations

import random

from ..kernel.agents import Tools

QUERIES = (
    "SELECT * FROM {table} LIMIT {k}",
    "SELECT COUNT(*) FROM {table}",
    "SELECT DISTINCT {column} FROM {table}",
    "SELECT MIN({column}), MAX({column}) FROM {table}",
    "SELECT {column}, COUNT(*) FROM {table} GROUP BY {column} ORDER BY 2 DESC LIMIT {k}",
    "SELECT * FROM {table} WHERE {column} IS NULL OR TRIM({column}) = ''",
)


class RandomPolicy:
    """Lists the batches, then makes up to `max_calls` random tool calls, then reports what it did."""
    name, oracle = "random", False

    def __init__(self, seed: int = 0, max_calls: int = 12):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"option 'seed' must be a whole number, not {seed!r}")
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 0:
            raise ValueError(f"option 'max_calls' must be a whole number >= 0, not {max_calls!r}")
        self.seed = seed
        self.max_calls = max_calls

    def _query(self, rng: random.Random, batches: list[dict], columns) -> str:
        targets = [(b["staging_table"], b["table"]) for b in batches] + [(f"wh_{t}", t) for t in columns]
        table, kind = rng.choice(targets)
        return rng.choice(QUERIES).format(table=table, column=rng.choice(columns[kind]), k=rng.randint(1, 20))

    def play(self, tools: Tools, case=None) -> None:
        rng = random.Random(f"{self.seed}:{tools.episode_seed}")
        suite = tools.suite  # the episode's vocabulary and tools
        names, columns, defects = suite.tool_names, suite.columns, suite.defect_types
        listing = tools("list_batches")
        batches = [b for b in listing if isinstance(b, dict)] if isinstance(listing, list) else []
        loaded, quarantined = [], []
        for _ in range(self.max_calls):
            tool = rng.choice(names)
            if tool == "submit_report":
                break
            batch = rng.choice(batches) if batches else {"batch_id": "B-0", "table": "orders",
                                                          "staging_table": "stg_b_0"}
            bid = batch["batch_id"]
            if tool in ("read_contract", "list_batches"):
                tools(tool)
            elif tool == "profile_batch":
                tools(tool, batch_id=bid)
            elif tool == "run_sql":
                tools(tool, query=self._query(rng, batches, columns))
            elif tool == "load_batch":
                if "error" not in tools(tool, batch_id=bid):
                    loaded.append(bid)
            elif tool == "quarantine_batch":
                column = rng.choice(columns[batch["table"]])
                if "error" not in tools(tool, batch_id=bid, column=column, defect_type=rng.choice(defects)):
                    quarantined.append(bid)
            elif tool == "ask_owner":  # suite v2's tools
                tools(tool, batch_id=bid, column=rng.choice(columns[batch["table"]]), value=rng.choice(("", "usd", "NZ")),
                      question="Is this all right?")
            elif tool == "cite_defect":
                tools(tool, batch_id=bid, column=rng.choice(columns[batch["table"]]), defect_type=rng.choice(defects))
            else:  # quarantine_rows: a few keys from a quick look
                key = suite.key_columns.get(batch["table"], columns[batch["table"]][0])
                seen = tools("run_sql", query=f"SELECT {key} FROM {batch['staging_table']} LIMIT {rng.randint(1, 3)}")
                keys = [str(r[0]) for r in seen.get("rows", [])] if isinstance(seen, dict) else []
                tools(tool, batch_id=bid, keys=keys, column=key, defect_type=rng.choice(defects))
        tools("submit_report", loaded=sorted(set(loaded)), quarantined=sorted(set(quarantined)))
