"""The gate tools as chat-completions function schemas, built from the suite's signatures.

The argument names and types come from the core signatures (`suites.signatures(suite)`: the
classic seven, or suite v2's ten), so a schema can never drift from what the episode accepts;
only the descriptions (what a model needs to know to use each tool well) are written here. A
model sees the tools of the episode's suite, and nothing else.
"""
from __future__ import annotations

from ..suites import defect_types, signatures

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
    # suite v2
    "quarantine_rows": "Hold rows of a batch back from its load, naming them by the batch's key column (order_id "
                       "or customer_id) and citing the column and defect type they break; then load_batch loads "
                       "the rest. Only before the batch is loaded; use one call per column and defect type.",
    "cite_defect": "Cite one more defect (column and defect type) of a batch you quarantined, or whose rows you "
                   "quarantined: every defect a batch has must be cited.",
    "ask_owner": "Ask the contract owner about a column of a batch: the answer gives the owner's rulings on the "
                 "values the contract leaves open there. Free when the contract leaves that column open, "
                 "otherwise it costs part of the night's reward (see the contract).",
}

ARGUMENT_DESCRIPTIONS = {
    "batch_id": "a batch id exactly as list_batches gives it",
    "query": "one SELECT statement (SQLite dialect)",
    "column": "the column of the batch's table where the defect is",
    "defect_type": "one of the contract's defect types",
    "loaded": "batch ids you loaded",
    "quarantined": "batch ids you quarantined",
    "keys": "the key values (order_id or customer_id) of the rows to hold back, at most 1000 a call",
    "question": "your question to the contract owner",
}


def _argument_schema(name: str, kind: str, suite: str) -> dict:
    if kind == "strlist":
        schema = {"type": "array", "items": {"type": "string"}}
    else:
        schema = {"type": "string"}
    if name == "defect_type":
        schema["enum"] = list(defect_types(suite))
    schema["description"] = ARGUMENT_DESCRIPTIONS[name]
    return schema


def tool_schemas(suite: str = "classic") -> list[dict]:
    """The `tools=` list for chat.completions.create, one function per tool of the suite, in signature order."""
    out = []
    for tool, signature in signatures(suite).items():
        out.append({"type": "function", "function": {
            "name": tool,
            "description": DESCRIPTIONS[tool],
            "parameters": {
                "type": "object",
                "properties": {name: _argument_schema(name, kind, suite) for name, kind in signature},
                "required": [name for name, _ in signature],
                "additionalProperties": False,
            },
        }})
    return out
