"""A fourth outside review's shortcut for suite v2 (never reads a row of wh_customers or wh_orders):
clean-night, and guesses from what a batch shows, each of which paid on the files of that review.

1. hold-all: where the rows a batch shows are the signature of a variant that also hides a
   warehouse-only row in that batch, every row is held back by rows (not quarantined whole), citing
   the hidden defect too: no clean row loaded, but (then) evidence earned;
2. pair: beside customers showing only a signup after the window (late-dimension variant 3), the one
   customer id outside tonight's customers that several orders name is held back as an orphan;
3. quiet night: where neither batch shows anything and the owner accepted nothing, every row of both
   batches is held back (late-dimension variant 1's re-sent customer and orphan orders);
4. clean-night's re-sent orders only beside a customers batch short of its usual volume, not a burst.
"""
from __future__ import annotations

import collections

from gate_pipeline.suites.v2 import history
from gate_pipeline.suites.v2.attackers import CleanNight, LoadLogOnly, fetch_values_or_none

SIGNATURES = {  # (table, what its rows show) -> the warehouse-only defect guessed beside it
    ("orders", frozenset({("status", "invalid_value")})): ("order_id", "duplicate_key"),
    ("customers", frozenset({("country", "invalid_value")})): ("customer_id", "duplicate_key"),
    ("orders", frozenset({("order_date", "out_of_window")})): ("customer_id", "orphan_reference"),
    ("orders", frozenset({("order_date", "out_of_window"), ("customer_id", "orphan_reference")})):
        ("customer_id", "orphan_reference"),
    ("orders", frozenset({("amount", "wrong_type")})): ("customer_id", "orphan_reference"),
}
ONE_ROW = {("status", "invalid_value"), ("country", "invalid_value"), ("amount", "wrong_type")}
KEY = {"orders": "order_id", "customers": "customer_id"}


class ShapeHold(CleanNight):
    name = "shape-hold"

    def prepare(self, tools, listing, contract):
        super().prepare(tools, listing, contract)
        self.listing, self.contract_ = listing, contract
        self.signup_after, self.quiet, self.tonight = False, False, set()

    def every_key(self, tools, batch) -> list[str]:
        return [str(k) for k in fetch_values_or_none(
            tools, f"SELECT {KEY[batch['table']]} FROM {batch['staging_table']}") or []]

    def judge(self, tools, batch, contract):
        table = batch["table"]
        if table == "orders" and self.quiet:
            super().judge(tools, batch, contract)  # the usual reads, its verdict unused
            return "rows", [("customer_id", "orphan_reference")], [
                (self.every_key(tools, batch), "customer_id", "orphan_reference")]
        verdict, citations, rows = super().judge(tools, batch, contract)
        if table == "customers":
            self.tonight = set(self.every_key(tools, batch))
            self.signup_after = verdict == "rows" and set(citations) == {("signup_date", "out_of_window")}
            if self.short and batch["rows"] > (history.usual((tools(
                    "run_sql", query=history.usual_sql("customers", batch["source"])) or {}).get("rows") or [])[0] or 0):
                self.short = False  # a burst, not a truncated file
            if verdict == "load" and not self.shown and self.orders_quiet(tools):
                self.quiet = True
                return "rows", [("customer_id", "duplicate_key")], [
                    (self.every_key(tools, batch), "customer_id", "duplicate_key")]
        if table == "orders" and self.signup_after and verdict in ("load", "rows"):
            return self.pair(tools, batch, citations, rows)
        hidden = SIGNATURES.get((table, frozenset(citations))) if verdict == "rows" else None
        if hidden and all(sum(len(k) for k, col, t in rows if (col, t) == c) == 1
                          for c in frozenset(citations) & ONE_ROW):
            held = {k for keys, _, _ in rows for k in keys}
            rest = [k for k in self.every_key(tools, batch) if k not in held]
            if rest:
                return "rows", list(dict.fromkeys([*citations, hidden])), [*rows, (rest, *hidden)]
        return verdict, citations, rows

    def orders_quiet(self, tools) -> bool:
        """Whether load-log-only, reading only, would find nothing in the orders batch."""
        peek = LoadLogOnly()
        peek.v2_tools = self.v2_tools
        peek.prepare(tools, self.listing, self.contract_)
        for b in self.listing:
            if b["table"] == "orders":
                verdict, _, _ = peek.judge(tools, b, self.contract_)
                return verdict == "load"
        return False

    def pair(self, tools, batch, citations, rows):
        pairs = (tools("run_sql", query=f"SELECT order_id, customer_id FROM {batch['staging_table']}")
                 or {}).get("rows") or []
        counts = collections.Counter(str(c) for _, c in pairs if str(c) not in self.tonight)
        several = [c for c, n in counts.items() if n >= 2]
        if len(several) != 1:
            return ("rows" if rows else "load"), citations, rows
        keys = [str(o) for o, c in pairs if str(c) == several[0]]
        return "rows", list(dict.fromkeys([*citations, ("customer_id", "orphan_reference")])), [
            *rows, (keys, "customer_id", "orphan_reference")]
