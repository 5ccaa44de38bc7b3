"""A case's assets, per `cases` partition: staging, the warehouse tables, the mart, the report.

`staging_batches` describes the case's staged batches; the `contract` asset check validates them
(checks.py). `agent_episode` is the op the agent plays in, through the engine with two sinks (the
run store and the tool bridge, which records each load, quarantine and the report as observations
while the agent plays); when the episode ends it materializes the warehouse tables of the case's
suite (`wh_customers`, `wh_orders` for gate's suites: the tables as the agent left them; one asset
per table of every registered suite, each skipped by the cases of a suite without it),
`revenue_mart` and `agent_report`. The agent is chosen in the run config from the agents this code
location knows (an enum, so a mistyped name is refused when the run is launched, before anything
runs or is stored); without one (the asset page's Materialize, a backfill) the case's suite's
target agent plays. Grading is not done here: the grading sensor grades the stored episode.
"""

from typing import Optional

import dagster as dg
from pydantic import Field

from ..kernel.agents import AgentOptionError, UnknownAgent, resolve_agent
from ..kernel.cases import Case, CaseError
from ..kernel.engine import play, prepare
from ..kernel.suite import suites
from ..kernel.world import PreparedCase
from ..store import StoreSink, manifest_body, process_name
from . import location  # noqa: F401  (the code location's settings: GATE_SUITES registered first)
from .bridge import ToolBridge
from .catalog import CODE_VERSION, OWNERS, AgentName, table_metadata
from .markdown import md_table
from .partitions import cases_partitions
from .resources import CaseLibrary, GateStore

CASE_GROUP = "gate_case"
PREVIEW_ROWS = 5


class EpisodeConfig(dg.Config):
    agent: Optional[AgentName] = Field(default=None, description="the agent that plays the case (default: the "
                                                                 "target agent of the case's suite: careful on a "
                                                                 "classic case, careful-v2 on a v2 case)")
    agent_options: dict = Field(default_factory=dict, description="keyword options for the agent's constructor")


def agent_for(config: EpisodeConfig, case: Case) -> str:
    """The agent a run plays a case with: the one configured, else the target agent of the case's suite."""
    if config.agent is not None:
        return config.agent.value
    target = suites.get(case.suite).target
    if not target:
        raise dg.Failure(description=f"suite {case.suite!r} names no target agent: choose one in the run config "
                                     f"(ops: agent_episode: config: agent)")
    return target


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
        parts.append(f"**{bid}** ({batch.table}, {rows[bid]} rows, staged as "
                     f"`{prepared.staging[bid]}`)\n\n" + md_table(cols, head))
    return "\n\n".join(parts)


@dg.asset(partitions_def=cases_partitions, group_name=CASE_GROUP, kinds={"sqlite"}, owners=OWNERS,
          code_version=CODE_VERSION, tags={"layer": "staging"},
          description="The case's staging batches (what the agent will find in staging); the `contract` check "
                      "validates them.")
def staging_batches(context: dg.AssetExecutionContext, case_library: CaseLibrary) -> dg.MaterializeResult:
    case, ref = _case(case_library, context.partition_key)
    prepared = prepare(case)
    row_counts = {b["batch_id"]: b["rows"] for b in prepared.listing}
    return dg.MaterializeResult(metadata={
        "suite": ref.suite, "split": ref.split, "family": case.family, "case_file": str(ref.path),
        "staging_tables": dg.MetadataValue.json({bid: prepared.staging[bid] for bid in prepared.order}),
        "row_counts": dg.MetadataValue.json(row_counts),
        "dagster/row_count": sum(row_counts.values()),
        "preview": dg.MetadataValue.md(_preview(prepared)),
    })


def _table_rows(warehouse: bytes, tables) -> dict[str, int]:
    """Rows of each warehouse table after the episode, counted in its final database image."""
    import sqlite3
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(warehouse)
        return {t: conn.execute(f"SELECT COUNT(*) FROM wh_{t}").fetchone()[0] for t in tables}
    finally:
        conn.close()


def _warehouse_tables() -> dict[str, tuple[str, ...]]:
    """Every registered suite's tables (GATE_SUITES' among them: `location` registered them as the
    definitions load), each with the tables its rows refer to, each after those."""
    refers: dict[str, tuple[str, ...]] = {}
    for suite in suites.all():
        for table in suite.columns:
            refers[table] = tuple(dict.fromkeys([*refers.get(table, ()), *suite.references.get(table, ())]))
    return {table: refers[table] for table in _after_references(refers)}


def _after_references(refers: dict[str, tuple[str, ...]]) -> list[str]:
    """The tables in an order where each comes after the tables it refers to (the order Dagster needs its
    assets yielded in); a reference to a table no suite has, or a loop, is left where it stands."""
    out: list[str] = []

    def visit(table: str, seen: tuple[str, ...]) -> None:
        if table in out or table in seen or table not in refers:
            return
        for other in refers[table]:
            visit(other, (*seen, table))
        out.append(table)

    for table in refers:
        visit(table, ())
    return out


WAREHOUSE_TABLES = _warehouse_tables()


@dg.multi_asset(
    name="agent_episode", partitions_def=cases_partitions, group_name=CASE_GROUP, can_subset=False,
    specs=[
        *(dg.AssetSpec(f"wh_{table}", deps=["staging_batches", *(f"wh_{r}" for r in refers)], kinds={"sqlite"},
                       owners=OWNERS, code_version=CODE_VERSION, tags={"layer": "warehouse"}, skippable=True,
                       description=f"Warehouse {table} as the agent left them (each load is an observation as it "
                                   f"happens).")
          for table, refers in WAREHOUSE_TABLES.items()),
        dg.AssetSpec("revenue_mart", deps=[f"wh_{t}" for t in WAREHOUSE_TABLES], kinds={"sqlite"}, owners=OWNERS,
                     code_version=CODE_VERSION, tags={"layer": "mart"},
                     description="Revenue of orders joined to customers, and the gap to the mart a correct run gives."),
        dg.AssetSpec("agent_report", deps=["revenue_mart"], kinds={"python"}, owners=OWNERS,
                     code_version=CODE_VERSION, tags={"layer": "report"},
                     description="The agent's report and the ledger digest; grades arrive as observations "
                                 "from the grading sensor."),
    ])
def agent_episode(context: dg.AssetExecutionContext, config: EpisodeConfig, gate_store: GateStore,
                  case_library: CaseLibrary):
    case, ref = _case(case_library, context.partition_key)
    try:
        spec = resolve_agent(agent_for(config, case), config.agent_options,
                             contracts=case_library.settings().contracts_dir)
    except (UnknownAgent, AgentOptionError) as exc:  # nothing is played or stored for an agent that cannot be built
        raise dg.Failure(description=str(exc)) from None
    context.instance.add_run_tags(context.run.run_id, {"gate/agent": spec.identity[:255]})
    store = gate_store.open()
    prepared = prepare(case)
    try:  # sealed before it is played: the one episode this run must produce
        store.seal_run(context.run.run_id, "case", manifest_body(
            [case], ref.path, [spec], 1, process_name(f"the Dagster run {context.run.run_id}")))
        result = play(prepared, spec, sinks=(StoreSink(store), ToolBridge(context)), run_id=context.run.run_id)
        store.complete_run(context.run.run_id, [(case.case_id, result.agent, 0, result.episode_id)])
        ep = store.episode(result.episode_id)
    finally:
        store.dispose()
        prepared.close()
    common = {"agent": result.agent, "episode_id": result.episode_id}
    g = result.grade
    tables = [t for t in WAREHOUSE_TABLES if t in prepared.suite.columns]  # each after the tables it refers to
    rows = _table_rows(result.warehouse, tables)
    for table in tables:
        yield dg.MaterializeResult(asset_key=f"wh_{table}", metadata={
            **common, **table_metadata(f"wh_{table}", prepared.suite.columns[table], rows[table])})
    yield dg.MaterializeResult(asset_key="revenue_mart", metadata={
        **common, "revenue": g.revenue, "correct_revenue": g.correct_revenue,
        "revenue_gap": round(g.revenue - g.correct_revenue, 2)})
    report = next((e["args"] for e in result.ledger if e["action"] == "submit_report" and e["executed"]), None)
    yield dg.MaterializeResult(asset_key="agent_report", metadata={
        **common, "ledger_digest": ep["ledger_digest"], "tool_calls": len(result.ledger),
        "report": dg.MetadataValue.json(report), "end_reason": result.end_reason, "error": result.error,
        "warehouse": ep["warehouse"], "run_store": store.url})
    if result.error:
        raise dg.Failure(description=f"agent {result.agent!r} failed ({result.error}); the stored episode grades 0",
                         metadata=common)
