"""Suite v2's baselines: careful-v2 (every rule of the v2 contract, the row-quarantine policy and the
owner, before any load) and oracle (handed the truth labels: every case solvable at 1.0).

Per batch, customers first: the file's header against the contract's columns (a drifted file is
quarantined: the loader would copy it by position); then every row, fetched fifty at a time by
rowid (`run_sql` returns at most 50 rows), into a DataFrame; the warehouse's part through SQL
that returns only what matters (the batch's keys the warehouse already holds, the customers it
lacks, the earlier nights' figures, the rows repeating a warehouse row); a question to the
contract owner for each column holding a value the contract leaves open; then the pandera
schemas built from the contract (`suite_v2.schemas`) decide, and the contract's row-quarantine
policy says whether to quarantine the bad rows and load the rest, or quarantine the batch and
cite every defect found. No labels, only what the tools return.

On a classic case (a contract without the v2 sections, tools without quarantine_rows) it
applies the classic rules the same way and quarantines whole batches.
"""
from __future__ import annotations

from ...kernel.agents import Tools, customers_first
from ...kernel.contract import rule_keys_option
from . import history as H
from .contract import KEY_COLUMNS
from .owner import LISTED
from .rules import FILE, HISTORY, RULE_KEYS_V2, rules_for

PAGE = 50
LIST_ITEMS = 1000


def rule_keys_v2(value) -> tuple[str, ...]:
    """The `without` option: a list of v2 rule keys (rules.CATALOGUE_V2)."""
    return rule_keys_option(value, RULE_KEYS_V2)


def _query(tools: Tools, query: str) -> dict:
    result = tools("run_sql", query=query)
    if not isinstance(result, dict) or "error" in result:
        raise RuntimeError(f"careful-v2: query failed: {result.get('error') if isinstance(result, dict) else result}")
    return result


def fetch_rows(tools: Tools, staging: str) -> tuple[list[str], list[list], int]:
    """(the file's columns, each column's values in row order as chunks, the number of rows), fifty rows a
    call, by rowid (no OFFSET: each page is a seek). Every CHUNK_ROWS rows, each column's values become one
    chunk (`schemas.column_chunk`: text in pandas' string dtype, with pyarrow one Arrow array), so the batch
    is never held as a Python object a value: at most a chunk's rows are."""
    from .schemas import CHUNK_ROWS, column_chunk  # pandas: only here
    columns = _query(tools, f"SELECT * FROM {staging} LIMIT 0")["columns"]
    chunks: list[list] = [[] for _ in columns]
    pending: list[list] = [[] for _ in columns]
    count = last = 0
    while True:
        page = _query(tools, f"SELECT rowid, * FROM {staging} WHERE rowid > {last} ORDER BY rowid LIMIT {PAGE}")["rows"]
        if page:
            for kept, column in zip(pending, list(zip(*page))[1:]):
                kept.extend(column)
        count += len(page)
        done = len(page) < PAGE
        if pending[0] and (done or len(pending[0]) >= CHUNK_ROWS):  # done may come with an empty page
            for kept, values in zip(chunks, pending):
                kept.append(column_chunk(values))
                values.clear()
        if done:
            return columns, chunks, count
        last = page[-1][0]


def fetch_values(tools: Tools, select: str) -> list:
    """Every distinct value of a one-column query, fifty a call, in order (keyset on the value)."""
    values, last = [], None
    while True:
        after = "" if last is None else " WHERE v > '" + str(last).replace("'", "''") + "'"
        page = _query(tools, f"WITH q(v) AS ({select}) SELECT DISTINCT v FROM q{after} ORDER BY v LIMIT {PAGE}")["rows"]
        values += [r[0] for r in page]
        if len(page) < PAGE:
            return values
        last = page[-1][0]


class CarefulV2:
    """See the module docstring. `without` removes rules (v2 rule keys); `contract_view` maps the
    contract read to the one the schemas are built from (a contract-schema variant).
    `warehouse_keys` (a class attribute the shortcut agents turn off): whether the keys of the
    warehouse are read (without them, only a batch's own rows show a duplicate key)."""
    name, oracle = "careful-v2", False
    warehouse_keys = True

    def __init__(self, without=(), contract_view=None, order=customers_first):
        self.without = rule_keys_v2(without)
        self.contract_view = contract_view
        self.order = order

    # hooks the attackers built on careful-v2 override ------------------------------------------
    def before_judging(self, tools: Tools, batch: dict, contract: dict) -> None:
        pass

    def extra_row_quarantines(self, batch: dict, df, key: str) -> list[tuple[list[str], str, str]]:
        return []

    def after_quarantine(self, tools: Tools, batch: dict, contract: dict) -> None:
        pass

    def override(self, batch: dict) -> str | None:
        """A decision taken without checking ("load" or "quarantine"), or None to judge the batch."""
        return None

    # ----------------------------------------------------------------------------------------
    def play(self, tools: Tools, case=None) -> None:
        contract = tools("read_contract")
        # the case's own contract says its suite: a v2 contract (its row-quarantine policy) comes with v2's
        # tools (rows, citations, the owner); asked before a variant's view, which never adds a section
        self.v2_tools = isinstance(contract, dict) and "row_quarantine" in contract
        if self.contract_view is not None:
            contract = self.contract_view(contract)
        loaded, quarantined = [], []
        listing = tools("list_batches")
        self.prepare(tools, listing, contract)
        for batch in self.order(listing):
            bid = batch["batch_id"]
            self.before_judging(tools, batch, contract)
            forced = self.override(batch)
            if forced == "load":
                tools("load_batch", batch_id=bid)
                loaded.append(bid)
                continue
            if forced == "quarantine":
                tools("quarantine_batch", batch_id=bid, column=KEY_COLUMNS[batch["table"]], defect_type="invalid_value")
                quarantined.append(bid)
                continue
            verdict, citations, rows = self.judge(tools, batch, contract)
            if verdict == "quarantine":
                (column, defect), *rest = citations
                tools("quarantine_batch", batch_id=bid, column=column, defect_type=defect)
                if self.v2_tools:
                    for column, defect in rest:
                        tools("cite_defect", batch_id=bid, column=column, defect_type=defect)
                self.after_quarantine(tools, batch, contract)
                quarantined.append(bid)
                continue
            for keys, column, defect in rows:
                for start in range(0, len(keys), LIST_ITEMS):
                    tools("quarantine_rows", batch_id=bid, keys=keys[start:start + LIST_ITEMS], column=column,
                          defect_type=defect)
            if rows:
                self.after_quarantine(tools, batch, contract)
            tools("load_batch", batch_id=bid)
            loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)

    def prepare(self, tools: Tools, listing: list[dict], contract: dict) -> None:
        pass

    def judge(self, tools: Tools, batch: dict, contract: dict):
        """("load" | "rows" | "quarantine", citations [(column, defect type)], row quarantines
        [(keys, column, defect type)])."""
        from .schemas import (  # pandas: only here
            HistoryFigures,
            contract_columns,
            disposition,
            findings,
            frame_of,
            header_drifted,
            median_of_amounts,
        )
        table, staging = batch["table"], batch["staging_table"]
        columns, values, count = fetch_rows(tools, staging)
        expected = contract_columns(contract, table)
        if rules_for(contract, table, self.without, FILE) and header_drifted(contract, table, columns):
            moved = next((c for i, c in enumerate(expected) if i >= len(columns) or columns[i] != c), expected[-1])
            return "quarantine", [(moved, "schema_drift")], []
        df = frame_of(columns, values, count)
        del values  # the frame holds its chunks
        stated = {r.key for r in rules_for(contract, table, self.without)}
        key = KEY_COLUMNS[table]
        keys: dict[str, set] = {}
        if f"{table}.{key}.duplicate_key" in stated and self.warehouse_keys:
            keys["existing_keys"] = set(fetch_values(tools, H.existing_keys_sql(table, staging)))
        if table == "orders" and "orders.customer_id.orphan_reference" in stated:
            keys["missing_customers"] = set(fetch_values(tools, H.missing_customers_sql(staging)))
        accepted = self.ask(tools, batch, contract, df)
        figures = None
        if rules_for(contract, table, self.without, HISTORY):
            usual_rows, usual_median = H.usual(_query(tools, H.usual_sql(table, batch["source"]))["rows"])
            repeated = _query(tools, H.repeated_rows_sql(staging))["rows"][0][0] \
                if f"{table}.order_id.duplicate_content" in stated else None
            median = median_of_amounts(df["amount"]) if "amount" in df else None
            figures = HistoryFigures(count, usual_rows, median, usual_median, repeated)
        found = findings(contract, table, columns, df, keys, figures, self.without, accepted)
        verdict = disposition(contract, found)
        if verdict == "rows" and not self.v2_tools:
            verdict = "quarantine"
        citations = list(dict.fromkeys((r.column, r.defect_type) for r in found.rules))
        spray = self.extra_row_quarantines(batch, df, key) if self.v2_tools and key in df else []
        if verdict == "load" and not spray:
            return "load", [], []
        if verdict == "quarantine":
            return "quarantine", citations, []
        quarantines = [([str(k) for k in df[key].iloc[rows_at]], rule.column, rule.defect_type)
                       for rule, rows_at in found.failures]
        return "rows", citations, quarantines + spray

    def ask(self, tools: Tools, batch: dict, contract: dict, df) -> dict[str, set[str]]:
        """Ask the owner about each value the batch holds that the contract does not list, in the columns
        the contract says to ask about; the values the owner accepts, per column."""
        accepted: dict[str, set[str]] = {}
        if not self.v2_tools or "ask_owner" not in contract:
            return accepted
        limits = contract["limits"]
        for column in contract["ask_owner"]["columns"]:
            if column not in df or column not in LISTED:
                continue
            listed = set(LISTED[column](limits))
            open_values = {v for v in df[column].dropna().astype(str) if v.strip() and v not in listed}
            for value in sorted(open_values):
                question = f"The contract does not list {value!r} for {column}; accept or reject?"
                answer = tools("ask_owner", batch_id=batch["batch_id"], column=column, value=value, question=question)
                if isinstance(answer, dict) and answer.get("ruling") == "accept":
                    accepted.setdefault(column, set()).add(value)
        return accepted


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
