"""The contract as asset checks: the pandera schemas from `gate_pipeline.schemas`, per partition.

One check per staged table (`customers_contract`, `orders_contract`) on `staging_batches`;
each validates every batch of that table in the case lazily and reports, per batch, the
rules that failed and pandera's failure cases. Severity WARN: they inform the human, the
agent still decides. Warehouse-aware rules use the seed warehouse (and, for the customer
reference, the customers staged in the same case, which a careful run loads first).
"""
from __future__ import annotations

import dagster as dg

from ..contract import COLUMNS
from ..schemas import build_schema, failing_rules, frame, rules_for
from ..world import PreparedCase
from .markdown import md_table

CHECKED_TABLES = ("customers", "orders")
FAILURE_ROWS = 20


def check_name(table: str) -> str:
    return f"{table}_contract"


def contract_check_specs(asset_key: str) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(check_name(t), asset=asset_key,
                              description=f"the contract's pandera schema for {t}, on every staged {t} batch")
            for t in CHECKED_TABLES]


def warehouse_keys(prepared: PreparedCase, table: str) -> dict[str, set]:
    seed = prepared.case["warehouse"]
    customers = {r["customer_id"] for r in seed["customers"]}
    if table == "customers":
        return {"customer_id": customers}
    staged = {r["customer_id"] for b in prepared.batches.values() if b["table"] == "customers" for r in b["rows"]}
    return {"customer_id": customers | staged, "order_id": {r["order_id"] for r in seed["orders"]}}


def contract_failures(prepared: PreparedCase, table: str) -> list[tuple[str, int, list, object]]:
    """(batch id, rows, rules that failed, pandera failure cases or None) per batch of `table`."""
    if getattr(prepared, "suite", "classic") == "v2":  # suite v2's schemas: header, rows and history
        from ..suites import contract_failures as v2_failures
        return v2_failures(prepared, table)
    contract = prepared.contract
    rules = rules_for(contract, table)
    schema = build_schema(contract, table, warehouse_keys(prepared, table))
    out = []
    for bid in prepared.order:
        batch = prepared.batches[bid]
        if batch["table"] == table:
            failed, cases = failing_rules(schema, frame(batch["rows"], COLUMNS[table]), rules)
            out.append((bid, len(batch["rows"]), failed, cases))
    return out


def _rules(prepared, table: str) -> list:
    if getattr(prepared, "suite", "classic") == "v2":
        from ..suite_v2.rules import rules_for as v2_rules
        return v2_rules(prepared.contract, table)
    return rules_for(prepared.contract, table)


def contract_check(prepared: PreparedCase, table: str) -> dg.AssetCheckResult:
    per_batch, failures = [], []
    for bid, rows, failed, cases in contract_failures(prepared, table):
        per_batch.append([bid, rows, ", ".join(r.key for r in failed) or "none"])
        if cases is not None:
            for row in cases.head(FAILURE_ROWS).itertuples(index=False):
                failures.append([bid, row.column, row.check, row.failure_case, row.index])
    bad = [b for b in per_batch if b[2] != "none"]
    metadata = {
        "batches_checked": len(per_batch),
        "batches_failing": len(bad),
        "rules": dg.MetadataValue.json([r.key for r in _rules(prepared, table)]),
        "per_batch": dg.MetadataValue.md(md_table(["batch", "rows", "failed rules"], per_batch)),
    }
    if failures:
        metadata["failure_cases"] = dg.MetadataValue.md(
            md_table(["batch", "column", "check", "failure case", "row"], failures))
    return dg.AssetCheckResult(check_name=check_name(table), passed=not bad, metadata=metadata,
                               severity=dg.AssetCheckSeverity.WARN,
                               description=f"{len(bad)} of {len(per_batch)} {table} batches break the contract")
