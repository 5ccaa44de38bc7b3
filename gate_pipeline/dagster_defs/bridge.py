"""The op-level tool bridge: every tool call of an episode, seen by Dagster as it happens.

`store.play_stored` executes each call on the episode and writes its ledger entries to the
run store; then this bridge turns the call into a Dagster event on the case's partition:
an executed load materializes `wh_customers` or `wh_orders`, a quarantine and the report are
observations, SQL reads and refused calls are logged. The agent never sees Dagster; it only
gets the tool's JSON value.
"""
from __future__ import annotations

import dagster as dg

STAGING, REPORT = "staging_batches", "agent_report"


class ToolBridge:
    """The `on_call` hook of `store.play_stored` for one episode inside an op."""

    def __init__(self, context, case_id: str, agent: str, log_reads: bool = True):
        self.context = context
        self.case_id = case_id
        self.agent = agent
        self.log_reads = log_reads
        self.episode_id = ""

    def _meta(self, entry: dict, **extra) -> dict:
        return {"agent": self.agent, "episode_id": self.episode_id, "ledger_seq": entry["seq"],
                "ledger_hash": entry["hash"], **extra}

    def __call__(self, tool, args, result, new_entries, episode, episode_id) -> None:
        self.episode_id = episode_id
        for entry in new_entries:
            self._emit(entry, episode)

    def _emit(self, entry: dict, episode) -> None:
        action, args, log = entry["action"], entry["args"], self.context.log
        if not entry["executed"]:
            log.warning(f"[{self.case_id} {self.agent}] refused {action}: {entry['note']}")
            return
        if action == "load_batch":
            table = episode.prepared.batches[args["batch_id"]]["table"]
            count = episode.world.conn.execute(f"SELECT COUNT(*) FROM wh_{table}").fetchone()[0]
            self.context.log_event(dg.AssetMaterialization(
                asset_key=f"wh_{table}", partition=self.case_id,
                description=f"{self.agent} loaded {args['batch_id']}",
                metadata=self._meta(entry, batch_id=args["batch_id"], rows_loaded=args["rows"],
                                    orphan_rows=args["orphan_rows"], table_rows=int(count))))
        elif action == "quarantine_batch":
            self.context.log_event(dg.AssetObservation(
                asset_key=STAGING, partition=self.case_id,
                description=f"{self.agent} quarantined {args['batch_id']}",
                metadata=self._meta(entry, batch_id=args["batch_id"], column=args["column"],
                                    defect_type=args["defect_type"], note=entry["note"])))
        elif action == "submit_report":
            self.context.log_event(dg.AssetObservation(
                asset_key=REPORT, partition=self.case_id, description=f"{self.agent} submitted its report",
                metadata=self._meta(entry, loaded=dg.MetadataValue.json(args["loaded"]),
                                    quarantined=dg.MetadataValue.json(args["quarantined"]))))
        elif action == "run_sql" and self.log_reads:
            log.debug(f"[{self.case_id} {self.agent}] read {args.get('tables_read')}: {args['query']}")
        elif self.log_reads:
            log.debug(f"[{self.case_id} {self.agent}] {action} {args}")
