"""The op-level tool bridge: every tool call of an episode, seen by Dagster as it happens.

An engine sink (`engine.Sink`): the engine hands it each ledger entry as it is appended, and
the bridge turns the entry into a Dagster event on the case's partition: an executed load is an
observation of `wh_customers` or `wh_orders` (rows loaded, the table's rows now), every other
decision of the suite's tools (a quarantine of a batch or of its rows, a further citation) one of
`staging_batches`, the report one of `agent_report`, each metadata key prefixed with the agent
(`naive/rows_loaded`); reads (at debug level), questions and refused calls are logged.

Observations, not materializations: a case run materializes the tables once, when the episode
ends (assets.py), and the nightly job, which plays many cases, materializes only its scoreboard.
It reads only the ledger and the case (row counts come from the case's seed warehouse plus the
rows each load entry records), never the episode's database. The agent never sees Dagster; it
only gets the tool's JSON value.
"""
from __future__ import annotations

import dagster as dg

from ..kernel.engine import EpisodeStart, Sink

STAGING, REPORT = "staging_batches", "agent_report"
LIST_PREVIEW = 20  # the first ids of a listed argument (rows held back) an observation shows


class ToolBridge(Sink):
    """Dagster events for the episodes one op plays (one bridge may see many episodes in turn)."""
    wants_entries = True

    def __init__(self, context, log_reads: bool = True):
        self.context = context
        self.log_reads = log_reads
        self.case_id = self.agent = self.episode_id = ""
        self.tables: dict[str, str] = {}
        self.rows: dict[str, int] = {}
        self.decisions: frozenset[str] = frozenset()

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

    def entry(self, episode_id: str, entry: dict) -> None:
        action, args, log = entry["action"], entry["args"], self.context.log
        tag = f"[{self.case_id} {self.agent}]"
        if not entry["executed"]:
            log.warning(f"{tag} refused {action}: {entry['note']}")
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
        elif self.log_reads:
            detail = f"read {args.get('tables_read')}: {args['query']}" if action == "run_sql" else f"{action} {args}"
            log.debug(f"{tag} {detail}")
