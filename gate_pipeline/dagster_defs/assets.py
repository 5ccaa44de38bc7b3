"""A case's assets, per `cases` partition: staging, the warehouse tables, the mart, the report.

`staging_batches` describes the case's staged batches and runs the contract checks.
`agent_episode` is the op the agent plays in, through the engine with two sinks (the run
store and the tool bridge): it owns `wh_customers` and `wh_orders` (materialized by the
bridge at each load, so a run that loads nothing leaves them untouched), `revenue_mart` and
`agent_report`. The agent is chosen in the run config by name (anything
`agents.resolve_agent` accepts) with `agent_options` passed to its constructor. Grading is
not done here: the grading sensor grades the stored episode.
"""

import dagster as dg
from pydantic import Field

from ..agents import AgentOptionError, UnknownAgent, resolve_agent
from ..cases import CaseError
from ..engine import play
from ..store import StoreSink
from ..suites import prepare
from ..world import PreparedCase
from .bridge import ToolBridge
from .checks import CHECKED_TABLES, contract_check, contract_check_specs
from .markdown import md_table
from .partitions import cases_partitions
from .resources import CaseLibrary, GateStore

CASE_GROUP = "gate_case"
PREVIEW_ROWS = 5


class EpisodeConfig(dg.Config):
    agent: str = Field(default="careful", description="any agent name gate knows (gate report --help lists them)")
    agent_options: dict = Field(default_factory=dict, description="keyword options for the agent's constructor")


def _case(case_library: CaseLibrary, case_id: str):
    try:
        return case_library.case(case_id)
    except (CaseError, OSError) as exc:
        raise dg.Failure(description=f"partition {case_id!r}: {exc}") from None


def _preview(prepared: PreparedCase) -> str:
    parts = []
    rows = {b["batch_id"]: b["rows"] for b in prepared.listing}
    for bid in prepared.order:
        batch = prepared.batches[bid]
        cols, head = prepared.preview(bid, PREVIEW_ROWS)
        parts.append(f"**{bid}** ({batch['table']}, {rows[bid]} rows, staged as "
                     f"`{prepared.staging[bid]}`)\n\n" + md_table(cols, head))
    return "\n\n".join(parts)


@dg.asset(partitions_def=cases_partitions, group_name=CASE_GROUP, kinds={"sqlite", "pandera"},
          check_specs=contract_check_specs("staging_batches"),
          description="The case's staging batches (what the agent will find in staging), with the "
                      "contract checks.")
def staging_batches(context: dg.AssetExecutionContext, case_library: CaseLibrary):
    case, ref = _case(case_library, context.partition_key)
    prepared = prepare(case)
    row_counts = {b["batch_id"]: b["rows"] for b in prepared.listing}
    yield dg.MaterializeResult(asset_key="staging_batches", metadata={
        "suite": ref.suite, "split": ref.split, "family": case["family"], "case_file": str(ref.path),
        "row_counts": dg.MetadataValue.json(row_counts),
        "rows": sum(row_counts.values()),
        "preview": dg.MetadataValue.md(_preview(prepared)),
    })
    for table in CHECKED_TABLES:
        yield contract_check(prepared, table)


@dg.multi_asset(
    name="agent_episode", partitions_def=cases_partitions, group_name=CASE_GROUP,
    specs=[
        dg.AssetSpec("wh_customers", deps=["staging_batches"], skippable=True, kinds={"sqlite"},
                     description="Warehouse customers; the tool bridge materializes it at each load."),
        dg.AssetSpec("wh_orders", deps=["staging_batches", "wh_customers"], skippable=True, kinds={"sqlite"},
                     description="Warehouse orders; the tool bridge materializes it at each load."),
        dg.AssetSpec("revenue_mart", deps=["wh_customers", "wh_orders"], kinds={"sqlite"},
                     description="Revenue of orders joined to customers, and the gap to the mart a correct run gives."),
        dg.AssetSpec("agent_report", deps=["revenue_mart"], kinds={"python"},
                     description="The agent's report and the ledger digest; grades arrive as observations "
                                 "from the grading sensor."),
    ])
def agent_episode(context: dg.AssetExecutionContext, config: EpisodeConfig, gate_store: GateStore,
                  case_library: CaseLibrary):
    case, _ = _case(case_library, context.partition_key)
    try:
        spec = resolve_agent(config.agent, config.agent_options, contracts=case_library.settings().contracts_dir)
    except (UnknownAgent, AgentOptionError) as exc:  # nothing is played or stored for an agent that cannot be built
        raise dg.Failure(description=str(exc)) from None
    store = gate_store.open()
    try:
        result = play(prepare(case), spec, sinks=(StoreSink(store), ToolBridge(context)),
                      run_id=context.run.run_id)
        ep = store.episode(result.episode_id)
    finally:
        store.dispose()
    common = {"agent": result.agent, "episode_id": result.episode_id}
    g = result.grade
    yield dg.MaterializeResult(asset_key="revenue_mart", metadata={
        **common, "revenue": g.revenue, "correct_revenue": g.correct_revenue,
        "revenue_gap": round(g.revenue - g.correct_revenue, 2)})
    report = next((e["args"] for e in result.ledger if e["action"] == "submit_report" and e["executed"]), None)
    yield dg.MaterializeResult(asset_key="agent_report", metadata={
        **common, "ledger_digest": ep["ledger_digest"], "tool_calls": len(result.ledger),
        "report": dg.MetadataValue.json(report), "end_reason": result.end_reason, "error": result.error,
        "warehouse": str(store.warehouse_path(ep))})
    if result.error:
        raise dg.Failure(description=f"agent {result.agent!r} failed ({result.error}); the stored episode grades 0",
                         metadata=common)
