"""The contract as an asset check on each case: the pandera schemas from `gate_pipeline.schemas`.

`contract` checks `staging_batches` per partition (the check's evaluation names its case): every
batch of the case is validated lazily against the schema of its table, and the check reports, per
batch, the rules that failed, and per failing row the column and the value that broke each rule.
Severity WARN: it informs the human, the agent still decides. Warehouse-aware rules use the seed
warehouse (and, for the customer reference, the customers staged in the same case, which a careful
run loads first). Partitioned asset checks are a preview API in Dagster 1.13: the one preview
warning this definition raises is expected and silenced here, nowhere else.
"""

import warnings

import dagster as dg

from ..cases import CaseError
from ..contract import COLUMNS
from ..suites import prepare
from ..world import PreparedCase
from .markdown import md_table
from .partitions import cases_partitions
from .resources import CaseLibrary

CHECK_NAME = "contract"
FAILURE_ROWS = 20


def warehouse_keys(prepared: PreparedCase, table: str) -> dict[str, set]:
    seed = prepared.case["warehouse"]
    customers = {r["customer_id"] for r in seed["customers"]}
    if table == "customers":
        return {"customer_id": customers}
    staged = {r["customer_id"] for b in prepared.batches.values() if b["table"] == "customers" for r in b["rows"]}
    return {"customer_id": customers | staged, "order_id": {r["order_id"] for r in seed["orders"]}}


def contract_failures(prepared: PreparedCase) -> list[tuple[str, str, int, list, list]]:
    """Per batch of the case: (batch id, table, rows, rules that failed, [(rule, row, column, value)])."""
    if getattr(prepared, "suite", "classic") == "v2":  # suite v2's schemas: header, rows and history
        from ..suites import contract_failures as v2_failures
        return v2_failures(prepared)
    import pandas as pd  # pandas and pandera: only here

    from ..schemas import build_schema, failing_rules, frame, rules_for
    out = []
    for bid in prepared.order:
        batch = prepared.batches[bid]
        table, contract = batch["table"], prepared.contract
        rules = rules_for(contract, table)
        df = frame(batch["rows"], COLUMNS[table])
        failed, cases = failing_rules(build_schema(contract, table, warehouse_keys(prepared, table)), df, rules)
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
        out.append((bid, table, len(batch["rows"]), failed, rows))
    return out


def contract_result(prepared: PreparedCase) -> dg.AssetCheckResult:
    per_batch, failures = [], []
    for bid, table, rows, failed, failing in contract_failures(prepared):
        per_batch.append([bid, table, rows, ", ".join(r.key for r in failed) or "none"])
        failures += [[bid, rule.defect_type, row, column, value] for rule, row, column, value in failing]
    bad = [b for b in per_batch if b[3] != "none"]
    metadata = {
        "case_id": prepared.case_id,
        "batches_checked": len(per_batch),
        "batches_failing": len(bad),
        "per_batch": dg.MetadataValue.md(md_table(["batch", "table", "rows", "failed rules"], per_batch)),
    }
    if failures:
        metadata["failures"] = dg.MetadataValue.md(
            md_table(["batch", "rule", "row", "column", "value"], failures[:FAILURE_ROWS]))
        metadata["failing_rows"] = len(failures)
    return dg.AssetCheckResult(check_name=CHECK_NAME, passed=not bad, metadata=metadata,
                               severity=dg.AssetCheckSeverity.WARN,
                               description=f"{prepared.case_id}: {len(bad)} of {len(per_batch)} batches break the "
                                           f"contract")


with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)  # partitioned checks: preview in 1.13

    @dg.asset_check(asset="staging_batches", name=CHECK_NAME, partitions_def=cases_partitions, blocking=False,
                    description="The contract's pandera schemas on every batch of the case: which rules each batch "
                                "breaks, with the column and value of every failing row (severity WARN).")
    def contract_check(context: dg.AssetCheckExecutionContext, case_library: CaseLibrary) -> dg.AssetCheckResult:
        try:
            case, _ = case_library.case(context.partition_key)
        except (CaseError, OSError) as exc:
            raise dg.Failure(description=f"partition {context.partition_key!r}: {exc}") from None
        return contract_result(prepare(case))
