"""Gold rows for the dense reward's Layer 2: the staging rows that break each defective batch's rule.

Why a module of its own: Layer 2 pays progress towards the rows a good inspection would find,
so they must be computed at reset, from the case alone, with the same rules gate grades and
the `careful` baseline checks by. The rules are not re-implemented here: the contract's pandera
schema (`schemas.build_schema`) is built with just the rule named in the batch's truth label,
and its failure cases give the failing row indexes. Each gold row is the tuple of the batch's
raw staging values in contract column order.
"""
from __future__ import annotations

from ...kernel.cases import Batch, Case
from .contract import COLUMNS
from .schemas import CATALOGUE, build_schema, failing_rules, frame, rules_for


def warehouse_keys(case: Case, table: str) -> dict[str, set]:
    """The keys the warehouse rules compare against, as a correct run would see them.

    A customers batch's ids must be new to the warehouse; an orders batch's customer must exist
    in the warehouse or in a clean customers batch (loaded first by a correct run).
    """
    wh = case.data["warehouse"]
    customers = {r.get("customer_id") for r in wh["customers"]}
    if table == "customers":
        return {"customer_id": customers}
    for batch in case.batches:
        if batch.table == "customers" and not batch.defective:
            customers |= {r.get("customer_id") for r in batch.data["rows"]}
    return {"customer_id": customers, "order_id": {r.get("order_id") for r in wh["orders"]}}


def failing_row_indexes(case: Case, batch: Batch, column: str, defect_type: str) -> list[int]:
    """Indexes of the batch's rows that break the contract rule (column, defect type)."""
    table = batch.table
    wanted = f"{table}.{column}.{defect_type}"
    others = [r.key for r in CATALOGUE if r.key != wanted]
    contract = dict(case.contract)
    rules = rules_for(contract, table, others)
    if not rules:
        return []
    schema = build_schema(contract, table, warehouse_keys(case, table), others)
    columns = COLUMNS[table]
    df = frame([[row.get(c) for c in columns] for row in batch.data["rows"]], columns)
    failed, cases = failing_rules(schema, df, rules)
    if not failed or cases is None:
        return []
    return sorted({int(i) for i in cases["index"].dropna()})


def gold_rows(case: Case) -> list[tuple]:
    """The rows of every defective batch that break the rule(s) its truth label names.

    Batches in case order, rows in batch order; a case with no defective batch gives [].
    """
    out: list[tuple] = []
    for batch in case.batches:
        truth = batch.truth
        if not truth.get("defective"):
            continue
        columns = COLUMNS[batch.table]
        picked: set[int] = set()
        for defect in truth.get("defects", ()):
            picked.update(failing_row_indexes(case, batch, defect["column"], defect["type"]))
        rows = batch.data["rows"]
        out.extend(tuple(rows[i].get(c) for c in columns) for i in sorted(picked))
    return out
