"""The seven gate tools as chat-completions function schemas, built from tools.SIGNATURES.

The argument names and types come from the core signatures, so a schema can never drift
from what Episode.call accepts; only the descriptions (what a model needs to know to use
each tool well) are written here.
"""
from __future__ import annotations

from ..contract import DEFECT_TYPES
from ..tools import SIGNATURES

DESCRIPTIONS = {
    "read_contract": "Return the data contract: the rules every customers and orders row must satisfy, "
                     "the machine-readable limits, the reporting window and the allowed defect types.",
    "list_batches": "List the batches waiting in staging tonight: batch_id, table (customers or orders), "
                    "row count, staging_table name and source.",
    "profile_batch": "Column statistics of one staged batch (nulls, blanks, distinct counts, min/max, "
                     "numeric range, most frequent values).",
    "run_sql": "Run one read-only SQLite SELECT over wh_customers, wh_orders and the stg_* staging tables. "
               "At most 50 rows come back (use LIMIT/OFFSET or aggregates); writes are refused.",
    "load_batch": "Load a staged batch into the warehouse. This cannot be undone, and the loader accepts "
                  "anything: it always answers errors: 0. Load customers batches before the orders that use them.",
    "quarantine_batch": "Keep a batch out of the warehouse, citing the column and the defect type found in it. "
                        "The first citation for a batch is final; quarantine does not remove rows already loaded.",
    "submit_report": "Finish the night: report exactly which batch ids you loaded and which you quarantined, "
                     "as listed. Only the first report counts; without a report the night earns no credit.",
}

ARGUMENT_DESCRIPTIONS = {
    "batch_id": "a batch id exactly as list_batches gives it",
    "query": "one SELECT statement (SQLite dialect)",
    "column": "the column of the batch's table where the defect is",
    "defect_type": "one of the contract's defect types",
    "loaded": "batch ids you loaded",
    "quarantined": "batch ids you quarantined",
}


def _argument_schema(name: str, kind: str) -> dict:
    if kind == "strlist":
        schema = {"type": "array", "items": {"type": "string"}}
    else:
        schema = {"type": "string"}
    if name == "defect_type":
        schema["enum"] = list(DEFECT_TYPES)
    schema["description"] = ARGUMENT_DESCRIPTIONS[name]
    return schema


def tool_schemas() -> list[dict]:
    """The `tools=` list for chat.completions.create, one function per gate tool, in SIGNATURES order."""
    out = []
    for tool, signature in SIGNATURES.items():
        out.append({"type": "function", "function": {
            "name": tool,
            "description": DESCRIPTIONS[tool],
            "parameters": {
                "type": "object",
                "properties": {name: _argument_schema(name, kind) for name, kind in signature},
                "required": [name for name, _ in signature],
                "additionalProperties": False,
            },
        }})
    return out
