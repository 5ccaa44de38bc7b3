"""What the classic contract finds in each batch of a case, judged as a careful run would: no labels.

Every batch is validated lazily against the pandera schema of its table (`schemas.py`). The
warehouse-aware rules compare with the seed warehouse and, for the customer reference, with the
customers batches that pass their own checks (a careful run loads those first). The Dagster
contract check shows the result.
"""
from __future__ import annotations

from ...kernel.world import BatchFindings
from .contract import COLUMNS


def _keys(prepared, table: str, loaded_customers: set[str]) -> dict[str, set]:
    seed = prepared.case.data["warehouse"]
    customers = {r["customer_id"] for r in seed["customers"]}
    if table == "customers":
        return {"customer_id": customers}
    staged = {r["customer_id"] for bid in loaded_customers for r in prepared.batches[bid].data["rows"]}
    return {"customer_id": customers | staged, "order_id": {r["order_id"] for r in seed["orders"]}}


def _batch(prepared, bid: str, loaded_customers: set[str]) -> BatchFindings:
    import pandas as pd  # pandas and pandera: only here

    from .schemas import build_schema, failing_rules, frame, rules_for
    batch = prepared.batches[bid]
    table, contract = batch.table, prepared.contract
    rules = rules_for(contract, table)
    df = frame(batch.data["rows"], COLUMNS[table])
    failed, cases = failing_rules(build_schema(contract, table, _keys(prepared, table, loaded_customers)), df, rules)
    rows = []
    if cases is not None:
        by_type = {r.defect_type: r for r in failed}
        seen = set()
        for check, index in zip(cases["check"].astype(str), cases["index"]):
            rule = by_type.get(check)
            if rule is None or pd.isna(index) or (check, index) in seen:
                continue
            seen.add((check, index))
            rows.append((rule, int(index), rule.column, df.at[int(index), rule.column]))
    return BatchFindings(bid, table, len(batch.data["rows"]), failed, rows)


def findings(prepared) -> list[BatchFindings]:
    """Per batch, in case order: the rules it breaks and its failing rows."""
    found: dict[str, BatchFindings] = {}
    customers = [bid for bid in prepared.order if prepared.batches[bid].table == "customers"]
    for bid in customers:
        found[bid] = _batch(prepared, bid, set())
    passed = {bid for bid in customers if not found[bid].rules}
    for bid in prepared.order:
        if bid not in found:
            found[bid] = _batch(prepared, bid, passed)
    return [found[bid] for bid in prepared.order]
