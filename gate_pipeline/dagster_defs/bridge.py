"""The op-level tool bridge: the tool calls of the episodes an op plays, seen by Dagster.

An engine sink (`engine.Sink`) with two granularities.

Live (`play_case`, one episode, perhaps a model taking minutes): the engine hands the bridge each
ledger entry as it is appended, and the bridge turns the entry into a Dagster event as it happens:
an executed load is an observation of `wh_customers` or `wh_orders` (rows loaded, the table's rows
now), every other decision of the suite's tools (a quarantine of a batch or of its rows, a further
citation) one of `staging_batches`, the report one of `agent_report`; reads (at debug level),
questions and refused calls are logged.

Per chunk (the nightly, thousands of episodes a night): one observation of the nightly's own asset
(`scoreboard`) when the chunk has played, with a table of its episodes: each case and agent, the
batches it loaded, its other decisions (quarantines, rows held back, further citations), its reward
(the grade computed as it ended), how it ended and its episode id. Dagster's event log stores each
observation in transactions of its own, so a night of 960 episodes in 8 chunks writes 8 of them, not
one per load, quarantine and report (2,880). Refused calls are logged as warnings either way; reads,
with `log_reads`, at debug level.

Live, each metadata key is prefixed with its agent (`naive/rows_loaded`): a partition's page shows the
latest value of each key, so an observation never hides which agent materialized the partition.
Observations, not materializations: a case run materializes the tables once, when the episode ends
(assets.py), and the nightly job, which plays many cases, materializes only its scoreboard. The
bridge reads only the ledger and the case (row counts come from the case's seed warehouse plus the
rows each load entry records), never the episode's database. The agent never sees Dagster; it only
gets the tool's JSON value.
"""
from __future__ import annotations

import dagster as dg

from ..kernel.engine import EpisodeStart, Sink
from ..kernel.records import EpisodeResult
from .markdown import md_table

STAGING, REPORT = "staging_batches", "agent_report"
LIST_PREVIEW = 20  # the first ids of a listed argument (rows held back) an observation shows


def _listed(args: dict) -> str:
    """A decision's arguments after its batch, as a cell: lists by their length and first ids."""
    parts = []
    for k, v in args.items():
        if k == "batch_id":
            continue
        if isinstance(v, list):
            more = f", +{len(v) - LIST_PREVIEW}" if len(v) > LIST_PREVIEW else ""
            v = f"{len(v)}: {', '.join(map(str, v[:LIST_PREVIEW]))}{more}"
        parts.append(f"{k}={v}")
    return "; ".join(parts)


class ToolBridge(Sink):
    """Dagster events for the episodes one op plays (one bridge may see many episodes in turn): each
    decision as it happens, or, with `chunk_asset`, one observation of that asset for all of them
    (`flush` emits it)."""
    wants_entries = True

    def __init__(self, context, log_reads: bool = True, chunk_asset: str | None = None):
        self.context = context
        self.log_reads = log_reads
        self.chunk_asset = chunk_asset
        self.wants_entries = chunk_asset is None or log_reads  # per chunk: each ledger is read as its episode ends
        self.case_id = self.agent = self.episode_id = ""
        self.tables: dict[str, str] = {}
        self.rows: dict[str, int] = {}
        self.decisions: frozenset[str] = frozenset()
        self.played: list[list] = []  # per chunk: a row per episode

    def start(self, episode: EpisodeStart) -> None:
        case, prepared = episode.case, episode.prepared
        self.case_id, self.agent, self.episode_id = case.case_id, episode.agent, episode.episode_id
        self.tables = {b.batch_id: b.table for b in case.batches}
        self.rows = prepared.warehouse_rows() if prepared is not None else {}
        tools = prepared.suite.tools if prepared is not None else ()
        self.decisions = frozenset(t.name for t in tools if t.shaped is None) - {"load_batch", "submit_report"}

    def _meta(self, entry: dict, **extra) -> dict:
        """An observation's metadata, each key prefixed with the agent (`naive/batch_id`): a partition's page
        shows the latest value of each key, so an observation never hides which agent materialized it."""
        fields = {"episode_id": self.episode_id, "ledger_seq": entry["seq"], "ledger_hash": entry["hash"], **extra}
        return {f"{self.agent}/{k}": v for k, v in fields.items()}

    def _refused(self, entry: dict) -> None:
        self.context.log.warning(f"[{self.case_id} {self.agent}] refused {entry['action']}: {entry['note']}")

    def entry(self, episode_id: str, entry: dict) -> None:
        action, args = entry["action"], entry["args"]
        if self.chunk_asset is not None:  # only the reads are logged as they happen; the rest when it ends
            if entry["executed"] and action not in self.decisions and action not in ("load_batch", "submit_report"):
                self._read(action, args)
            return
        if not entry["executed"]:
            self._refused(entry)
            return
        if action == "load_batch":
            table = self.tables[args["batch_id"]]
            self.rows[table] = self.rows.get(table, 0) + args["rows"]
            self.context.log_event(dg.AssetObservation(
                asset_key=f"wh_{table}", partition=self.case_id,
                description=f"{self.agent} loaded {args['batch_id']}",
                metadata=self._meta(entry, batch_id=args["batch_id"], rows_loaded=args["rows"],
                                    orphan_rows=args["orphan_rows"], table_rows=self.rows[table])))
        elif action in self.decisions:  # a quarantine (of a batch or of rows), a further citation...
            shown = {k: (dg.MetadataValue.json(v[:LIST_PREVIEW]) if isinstance(v, list) else v)
                     for k, v in args.items()}
            shown.update({f"{k}_count": len(v) for k, v in args.items() if isinstance(v, list)})
            self.context.log_event(dg.AssetObservation(
                asset_key=STAGING, partition=self.case_id,
                description=f"{self.agent}: {action} {args.get('batch_id', '')}".rstrip(),
                metadata=self._meta(entry, action=action, **shown, note=entry["note"])))
        elif action == "submit_report":
            self.context.log_event(dg.AssetObservation(
                asset_key=REPORT, partition=self.case_id, description=f"{self.agent} submitted its report",
                metadata=self._meta(entry, loaded=", ".join(args["loaded"]) or "none",
                                    quarantined=", ".join(args["quarantined"]) or "none")))
        else:
            self._read(action, args)

    def _read(self, action: str, args: dict) -> None:
        if self.log_reads:
            detail = f"read {args.get('tables_read')}: {args['query']}" if action == "run_sql" else f"{action} {args}"
            self.context.log.debug(f"[{self.case_id} {self.agent}] {detail}")

    def fail(self, episode_id: str, reason: str) -> None:
        self.context.log.error(f"[{self.case_id} {self.agent}] the machine failed episode {episode_id}: {reason}")

    # -- per chunk -----------------------------------------------------------------------------
    def end(self, result: EpisodeResult) -> None:
        if self.chunk_asset is None:
            return
        loaded, decided = [], []
        for entry in result.ledger:
            action, args = entry["action"], entry["args"]
            if not entry["executed"]:
                self._refused(entry)
            elif action == "load_batch":
                loaded.append(args["batch_id"])
            elif action in self.decisions:
                detail = _listed(args)
                decided.append(f"{action} {args.get('batch_id', '')}".rstrip() + (f" ({detail})" if detail else ""))
        self.played.append([result.case_id, result.agent, ", ".join(loaded) or "none", "; ".join(decided) or "none",
                            f"{result.grade.reward:.4f}", result.end_reason, result.episode_id])

    def flush(self, description: str = "") -> None:
        """Per chunk: the observation of the episodes played since the last one, if there are any."""
        if self.chunk_asset is None or not self.played:
            return
        table = md_table(["case", "agent", "loaded", "other decisions", "reward", "ended", "episode"], self.played)
        self.context.log_event(dg.AssetObservation(
            asset_key=self.chunk_asset, description=description or f"{len(self.played)} episodes played",
            metadata={"episodes": len(self.played), "played": dg.MetadataValue.md(table)}))
        self.played = []
