"""The classic suite's seven tools: what each takes and what a model is told of it, and its episode.

The tools themselves are the kernel's (`kernel.episode.Episode`): exact results, refusals and
ledger entries, as CONFORMANCE §4 gives them. The classic episode plays them on a private copy of
the case's database (`world.ClassicWorld`).
"""
from __future__ import annotations

from ...kernel.episode import Episode
from ...kernel.suite import Arg, Tool
from .world import ClassicWorld

BATCH_ID = Arg("batch_id", "str", "a batch id exactly as list_batches gives it")
COLUMN = Arg("column", "str", "the column of the batch's table where the defect is")
DEFECT_TYPE = Arg("defect_type", "str", "one of the contract's defect types", enum="defect_types")

READ_CONTRACT = Tool("read_contract", "Return the data contract: the rules every customers and orders row must "
                     "satisfy, the machine-readable limits, the reporting window and the allowed defect types.")
LIST_BATCHES = Tool("list_batches", "List the batches waiting in staging tonight: batch_id, table (customers or "
                    "orders), row count, staging_table name and source.")
PROFILE_BATCH = Tool("profile_batch", "Column statistics of one staged batch (nulls, blanks, distinct counts, "
                     "min/max, numeric range, most frequent values).", (BATCH_ID,), shaped="SAMPLE")
RUN_SQL = Tool("run_sql", "Run one read-only SQLite SELECT over wh_customers, wh_orders and the stg_* staging "
               "tables. At most 50 rows come back (use LIMIT/OFFSET or aggregates); writes are refused.",
               (Arg("query", "str", "one SELECT statement (SQLite dialect)", limit=None),), shaped="QUERY")
LOAD_BATCH = Tool("load_batch", "Load a staged batch into the warehouse. This cannot be undone, and the loader "
                  "accepts anything: it always answers errors: 0. Load customers batches before the orders that "
                  "use them.", (BATCH_ID,), shaped=None)
QUARANTINE_BATCH = Tool("quarantine_batch", "Keep a batch out of the warehouse, citing the column and the defect "
                        "type found in it. The first citation for a batch is final; quarantine does not remove "
                        "rows already loaded.", (BATCH_ID, COLUMN, DEFECT_TYPE), shaped=None)
SUBMIT_REPORT = Tool("submit_report", "Finish the night: report exactly which batch ids you loaded and which you "
                     "quarantined, as listed. Only the first report counts; without a report the night earns no "
                     "credit.", (Arg("loaded", "strlist", "batch ids you loaded"),
                                 Arg("quarantined", "strlist", "batch ids you quarantined")), shaped=None)

TOOLS = (READ_CONTRACT, LIST_BATCHES, PROFILE_BATCH, RUN_SQL, LOAD_BATCH, QUARANTINE_BATCH, SUBMIT_REPORT)
TOOL_NAMES = tuple(t.name for t in TOOLS)


class ClassicEpisode(Episode):
    """One play of one classic case: the seven tools on a private copy of its database."""

    world_class = ClassicWorld
EPISODE = ClassicEpisode
