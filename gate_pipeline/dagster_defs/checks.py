"""The contract as an asset check on each case: what the case's suite's contract finds in every batch.

`contract` checks `staging_batches` per partition (the check's evaluation names its case): every
batch of the case is judged by its suite's pandera schemas (`Suite.findings`, without truth
labels, as a careful run would judge it), and the check reports, per batch, the rules that failed,
and per failing row the column and the value that broke each rule. Severity WARN: it informs the
human, the agent still decides. Partitioned asset checks are a preview API in Dagster 1.13: the one
preview warning this definition raises is expected and silenced here, nowhere else.
"""

import warnings

import dagster as dg

from ..kernel.cases import CaseError
from ..kernel.engine import prepare
from ..kernel.world import PreparedCase
from .markdown import md_table
from .partitions import cases_partitions
from .resources import CaseLibrary

CHECK_NAME = "contract"
FAILURE_ROWS = 20


def contract_result(prepared: PreparedCase) -> dg.AssetCheckResult:
    per_batch, failures = [], []
    for found in prepared.suite.findings(prepared):
        per_batch.append([found.batch_id, found.table, found.rows, ", ".join(r.key for r in found.rules) or "none"])
        failures += [[found.batch_id, rule.defect_type, row, column, value] for rule, row, column, value in found.failing]
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
        prepared = prepare(case)
        try:
            return contract_result(prepared)
        finally:
            prepared.close()
