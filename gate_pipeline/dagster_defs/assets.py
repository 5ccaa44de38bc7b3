"""A case's assets, per `cases` partition: staging, the warehouse tables, the mart, the report.

`staging_batches` writes the case's staging image to GATE_HOME and runs the contract checks.
`agent_episode` is the op the agent plays in: it owns `wh_customers` and `wh_orders`
(materialized by the tool bridge at each load, so a run that loads nothing leaves them
untouched), `revenue_mart` and `agent_report`. The agent is chosen in the run config by
name (anything `make_agent` accepts) with `agent_options` passed to its constructor.
Grading is not done here: the grading sensor grades the stored run.
"""

import dagster as dg
from pydantic import Field

from ..agents import UnknownAgent, make_agent
from ..cases import CaseError
from ..contract import COLUMNS
from ..store import play_stored
from ..world import PreparedCase, World
from .bridge import ToolBridge
from .checks import CHECKED_TABLES, contract_check, contract_check_specs
from .markdown import md_table
from .partitions import cases_partitions
from .resources import CaseLibrary, GateStore

CASE_GROUP = "gate_case"
PREVIEW_ROWS = 5


class EpisodeConfig(dg.Config):
    agent: str = Field(default="careful", description="any agent name make_agent accepts")
    agent_options: dict = Field(default_factory=dict, description="keyword options for the agent's constructor")


def _case(case_library: CaseLibrary, case_id: str):
    try:
        return case_library.case(case_id)
    except (CaseError, OSError) as exc:
        raise dg.Failure(description=f"partition {case_id!r}: {exc}") from None


def _preview(prepared: PreparedCase) -> str:
    parts = []
    for bid in prepared.order:
        batch = prepared.batches[bid]
        cols = COLUMNS[batch["table"]]
        parts.append(f"**{bid}** ({batch['table']}, {len(batch['rows'])} rows, staged as "
                     f"`{prepared.staging[bid]}`)\n\n"
                     + md_table(cols, [[r.get(c) for c in cols] for r in batch["rows"][:PREVIEW_ROWS]]))
    return "\n\n".join(parts)


@dg.asset(partitions_def=cases_partitions, group_name=CASE_GROUP, kinds={"sqlite", "pandera"},
          check_specs=contract_check_specs("staging_batches"),
          description="The case's staging batches, materialized into the case's SQLite database under "
                      "GATE_HOME, with the contract checks.")
def staging_batches(context: dg.AssetExecutionContext, gate_store: GateStore, case_library: CaseLibrary):
    case, ref = _case(case_library, context.partition_key)
    prepared = PreparedCase(case)
    store = gate_store.open()
    path = store.home / "cases" / f"{prepared.case_id}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    World(prepared, path).close()
    yield dg.MaterializeResult(asset_key="staging_batches", metadata={
        "suite": ref.suite, "split": ref.split, "family": case["family"], "case_file": str(ref.path),
        "database": str(path),
        "row_counts": dg.MetadataValue.json({bid: len(prepared.batches[bid]["rows"]) for bid in prepared.order}),
        "rows": sum(len(b["rows"]) for b in prepared.batches.values()),
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
    prepared = PreparedCase(case)
    store = gate_store.open()
    try:
        make_agent(config.agent, **config.agent_options)
    except UnknownAgent as exc:
        episode_id = store.fail_unstarted(prepared, config.agent, config.agent_options, context.run.run_id, str(exc))
        raise dg.Failure(description=str(exc), metadata={"episode_id": episode_id}) from None
    bridge = ToolBridge(context, prepared.case_id, config.agent)
    episode_id, error = play_stored(store, prepared, config.agent, config.agent_options, context.run.run_id,
                                    on_call=bridge)
    ep = store.episode(episode_id)
    mart, correct = store.stored_mart(ep), prepared.correct_mart
    common = {"agent": config.agent, "episode_id": episode_id}
    yield dg.MaterializeResult(asset_key="revenue_mart", metadata={
        **common, "revenue": mart, "correct_revenue": correct, "revenue_gap": round(mart - correct, 2)})
    entries = store.entries(episode_id)
    report = next((e["args"] for e in entries if e["action"] == "submit_report" and e["executed"]), None)
    yield dg.MaterializeResult(asset_key="agent_report", metadata={
        **common, "ledger_digest": ep["ledger_digest"], "tool_calls": len(entries),
        "report": dg.MetadataValue.json(report), "error": error or "",
        "warehouse": str(store.warehouse_path(ep))})
    if error:
        raise dg.Failure(description=f"agent {config.agent!r} raised {error}; the stored run will grade 0",
                         metadata=common)
