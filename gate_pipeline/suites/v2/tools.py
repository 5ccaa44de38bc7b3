"""The tools of a v2 episode: the classic seven, and three more the v2 contract needs.

The classic seven keep their names, arguments, results and refusal texts; in a v2 episode they
work on the v2 world (columns, defect types, the by-position loader) and `run_sql` records which
batches a read looked at (`looked_at`, see `suite_v2.sandbox`). The three new tools:

- `quarantine_rows(batch_id, keys, column, defect_type)`: hold rows of a batch back from its
  load, named by the key column (order_id, customer_id) and cited like a batch. Before the
  batch is loaded, and only keys that name rows: `load_batch` then loads the rest, and the batch
  is a loaded batch (the report lists it under `loaded`; its answer, the tool's description and
  the contract's `row_quarantine.rule` all say so).
- `cite_defect(batch_id, column, defect_type)`: cite one more defect of a batch that is
  quarantined or holds quarantined rows (a batch can have several; each must be cited).
- `ask_owner(batch_id, column, value, question)`: ask the contract owner about a value of a
  batch's column; the answer is the owner's ruling on the value (`suite_v2.owner`: by column and
  value alone, whichever batch is named), free for the columns the contract's `ask_owner.columns`
  names, at its cost per question for any other column (exactly as the contract words it; the
  grader charges the same).
"""
from __future__ import annotations

from ...kernel.episode import Episode
from ...kernel.suite import Arg, Tool
from .contract import COLUMNS_V2, KEY_COLUMNS, question_cost
from .world import PreparedCaseV2, WorldV2, _quoted

BATCH_ID = Arg("batch_id", "str", "a batch id exactly as list_batches gives it")
COLUMN = Arg("column", "str", "the column of the batch's table where the defect is")
DEFECT_TYPE = Arg("defect_type", "str", "one of the contract's defect types", enum="defect_types")

TOOLS = (
    Tool("read_contract", "Return the data contract: the rules every customers and orders row must satisfy, the "
         "machine-readable limits, the reporting window, the allowed defect types, the file, history, row "
         "quarantine and contract-owner sections."),
    Tool("list_batches", "List the batches waiting in staging tonight: batch_id, table (customers or orders), row "
         "count, staging_table name and source."),
    Tool("profile_batch", "Column statistics of one staged batch (nulls, blanks, distinct counts, min/max, numeric "
         "range, most frequent values).", (BATCH_ID,), shaped="SAMPLE"),
    Tool("run_sql", "Run one read-only SQLite SELECT over wh_customers, wh_orders, wh_load_log and the stg_* staging "
         "tables. At most 50 rows come back (use LIMIT/OFFSET or aggregates); writes are refused. 'now' is tonight's "
         "load time.",
         (Arg("query", "str", "one SELECT statement (SQLite dialect)", limit=None),), shaped="QUERY"),
    Tool("load_batch", "Load a staged batch into the warehouse (without the rows quarantine_rows held back). This "
         "cannot be undone, and the loader accepts anything: it always answers errors: 0. Load customers batches "
         "before the orders that use them. The warehouse takes a batch at most twice a night.",
         (BATCH_ID,), shaped=None),
    Tool("quarantine_batch", "Keep a whole batch out of the warehouse, citing the column and the defect type found "
         "in it (cite_defect cites the others). The first citation for a batch is final; quarantine does not remove "
         "rows already loaded.", (BATCH_ID, COLUMN, DEFECT_TYPE), shaped=None),
    Tool("quarantine_rows", "Hold rows of a batch back from its load, naming them by the batch's key column "
         "(order_id or customer_id) and citing the column and defect type they break; then load_batch loads the "
         "rest, and the batch counts as loaded (report it under loaded, not under quarantined). Only before the "
         "batch is loaded; use one call per column and defect type.",
         (BATCH_ID, Arg("keys", "strlist", "the key values (order_id or customer_id) of the rows to hold back, "
                                           "at most 1000 a call"), COLUMN, DEFECT_TYPE), shaped=None),
    Tool("cite_defect", "Cite one more defect (column and defect type) of a batch you quarantined, or whose rows you "
         "held back: every defect a batch has must be cited, each citation counts for one defect.",
         (BATCH_ID, COLUMN, DEFECT_TYPE), shaped=None),
    Tool("ask_owner", "Ask the contract owner about a value you found in a column of a batch that the contract does "
         "not list: the answer is the owner's ruling on that value (accept, reject with the defect type to cite, or "
         "none: the contract settles it). Free for the columns the contract's ask_owner.columns names; a question "
         "about any other column costs ask_owner.cost_per_question of the night's reward.",
         (BATCH_ID, Arg("column", "str", "the column of the batch's table you ask about"),
          Arg("value", "str", "the value you ask about, exactly as the batch holds it"),
          Arg("question", "str", "your question to the contract owner", limit=1_000))),
    Tool("submit_report", "Finish the night: report exactly which batch ids you loaded (whole, or with rows held "
         "back) and which you quarantined whole, as listed. Only the first report counts; without a report the "
         "night earns no credit.",
         (Arg("loaded", "strlist", "batch ids you loaded, rows held back or not"),
          Arg("quarantined", "strlist", "batch ids you quarantined whole")),
         shaped=None),
)
TOOL_NAMES_V2 = tuple(t.name for t in TOOLS)
# a night's loads of one batch: a second load is the duplicate the grade counts, and a third is refused, so an
# episode's database grows by at most twice what is staged (an agent cannot load until the machine has no room,
# which is the machine's failure, `NoRoom`, and would end the run without grading the agent)
MAX_LOADS = 2


class EpisodeV2(Episode):
    """One play of one v2 case: the world, its ledger, and the ten tools over them."""

    world_class = WorldV2
    world: WorldV2
    prepared: PreparedCaseV2

    def cite(self, batch_id: str, column: str, defect_type: str) -> None:
        cited = self.world.citations.setdefault(batch_id, [])
        if (column, defect_type) not in cited:
            cited.append((column, defect_type))

    # -- the tools that differ in v2 -------------------------------------------------------------
    def profile_batch(self, batch_id):
        if batch_id in self.prepared.batches:  # through this episode's connection, not the one it may have lent
            self.prepared.profile_on(batch_id, self.world.conn)
        result = super().profile_batch(batch_id)
        if batch_id in self.prepared.batches:
            self.world.sandbox.mark_looked(self.prepared.staging[batch_id])
        return result

    def load_batch(self, batch_id):
        world = self.world
        if world.loads.get(batch_id, 0) >= MAX_LOADS and batch_id not in world.quarantined:
            self.ledger.append("load_batch", {"batch_id": batch_id}, False, "load limit")
            return {"error": f"{batch_id} is loaded {MAX_LOADS} times tonight; the warehouse takes no more of it"}
        return super().load_batch(batch_id)

    def load_entry(self, batch_id: str, rows: int, orphans: int) -> dict:
        return {"batch_id": batch_id, "rows": rows, "orphan_rows": orphans,
                "held_back": self.world.held_rows.get(batch_id, 0)}

    def load_result(self, batch_id: str, rows: int) -> dict:
        result = {"status": "loaded", "rows_loaded": rows, "errors": 0}
        held = self.world.held_rows.get(batch_id, 0)
        if held:
            result["rows_held_back"] = held
        return result

    def quarantine_rows(self, batch_id, keys, column, defect_type):
        world, prepared = self.world, self.prepared
        args = {"batch_id": batch_id, "keys": keys, "column": column, "defect_type": defect_type}
        problem = self.citation_problem("quarantine_rows", args, batch_id, column, defect_type)
        if problem:
            return problem
        table = prepared.batches[batch_id].table
        key = KEY_COLUMNS[table]
        if batch_id in world.quarantined:
            self.ledger.append("quarantine_rows", args, False, "quarantined")
            return {"error": f"{batch_id} is quarantined"}
        if world.loads.get(batch_id):
            self.ledger.append("quarantine_rows", args, False, "already loaded")
            return {"error": f"{batch_id} is already loaded; rows cannot be held back from a load that happened"}
        if key not in prepared.headers[batch_id]:
            self.ledger.append("quarantine_rows", args, False, "no key column")
            return {"error": f"{batch_id}'s file has no column {key!r} to name its rows by"}
        if not keys:
            self.ledger.append("quarantine_rows", args, False, "no keys")
            return {"error": "keys must name at least one row"}
        held = world.held.setdefault(batch_id, set())
        new = sorted(set(keys) - held)
        found = dict(world.conn.execute(
            f"SELECT {_quoted(key)}, COUNT(*) FROM {prepared.staging[batch_id]} "
            f"WHERE {_quoted(key)} IN ({', '.join('?' * len(new))}) GROUP BY 1", new).fetchall()) if new else {}
        if not found and not (set(keys) & held):
            self.ledger.append("quarantine_rows", args, False, "unknown keys")
            return {"error": f"none of these keys names a row of {batch_id} (by {key})"}
        matched = sum(found.values())
        self.ledger.append("quarantine_rows", {**args, "rows_matched": matched}, True)
        held.update(found)
        world.held_rows[batch_id] = world.held_rows.get(batch_id, 0) + matched
        self.cite(batch_id, column, defect_type)
        return {"status": "held", "batch_id": batch_id, "rows_held": matched, "keys_not_found": len(new) - len(found),
                "next": "load_batch loads the other rows; the report lists this batch under loaded"}

    def cite_defect(self, batch_id, column, defect_type):
        world = self.world
        args = {"batch_id": batch_id, "column": column, "defect_type": defect_type}
        problem = self.citation_problem("cite_defect", args, batch_id, column, defect_type)
        if problem:
            return problem
        if batch_id not in world.quarantined and not world.held.get(batch_id):
            self.ledger.append("cite_defect", args, False, "not quarantined")
            return {"error": f"{batch_id} is not quarantined and holds no quarantined rows; quarantine it "
                             f"(quarantine_batch) or its rows (quarantine_rows) first"}
        if (column, defect_type) in world.citations.get(batch_id, ()):
            self.ledger.append("cite_defect", args, False, "already cited")
            return {"error": f"{batch_id}: {column} / {defect_type} is already cited"}
        self.ledger.append("cite_defect", args, True)
        self.cite(batch_id, column, defect_type)
        return {"status": "cited", "batch_id": batch_id, "citations": len(world.citations[batch_id])}

    def ask_owner(self, batch_id, column, value, question):
        prepared = self.prepared
        args = {"batch_id": batch_id, "column": column, "value": value, "question": question}
        if batch_id not in prepared.batches:
            self.ledger.append("ask_owner", args, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        columns = COLUMNS_V2[prepared.batches[batch_id].table]
        if column not in columns:  # the contract's columns, not the file's header: a refusal shows no file
            self.ledger.append("ask_owner", args, False, "unknown column")
            return {"error": f"column must be one of {list(columns)}"}
        self.ledger.append("ask_owner", args, True)
        return {"batch_id": batch_id, "column": column, "value": value, **prepared.owner.answer(column, value),
                "cost": question_cost(prepared.contract, column)}


EPISODE = EpisodeV2
