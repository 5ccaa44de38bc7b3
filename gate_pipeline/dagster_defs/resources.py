"""Resources: where runs are stored (GATE_HOME, the run-store URL) and where cases and contracts
are read (GATE_CASES_DIR, GATE_CONTRACTS).

Each field left unset takes its value from the environment's settings, resolved when a run or a
sensor tick starts (`run_settings`), so the webserver, the daemon and an in-process run share one
store and one case library.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import dagster as dg

from ..kernel.cases import Case
from ..kernel.settings import Settings
from ..store import RunStore, StoreError
from .location import run_settings
from .partitions import CaseIndex, CaseRef, case_index, load_case


class GateStore(dg.ConfigurableResource):
    """The run store at `db_url` (episodes, ledgers, warehouses, grades); `home` holds its key and pages."""

    home: Optional[str] = None
    db_url: Optional[str] = None

    def settings(self) -> Settings:
        base = run_settings()
        return dataclasses.replace(base, home=Path(self.home).resolve() if self.home else base.home,
                                   db_url=self.db_url or base.db_url)

    def open(self, once: bool = False) -> RunStore:
        """The run store; with `once`, not checked again if this process has checked it (a night's steps
        after its plan, which checks it, and their step outputs)."""
        try:
            return RunStore(self.settings(), once=once)
        except StoreError as exc:  # a bad setting is one clear failure, not a traceback
            raise dg.Failure(description=str(exc)) from None


class CaseLibrary(dg.ConfigurableResource):
    """The case files (every `*.jsonl` under `cases_dir`) and the contracts (`contracts_dir`)."""

    cases_dir: Optional[str] = None
    contracts_dir: Optional[str] = None

    def settings(self) -> Settings:
        base = run_settings()
        return dataclasses.replace(
            base, cases_dir=Path(self.cases_dir).resolve() if self.cases_dir else base.cases_dir,
            contracts_dir=Path(self.contracts_dir).resolve() if self.contracts_dir else base.contracts_dir)

    def index(self) -> CaseIndex:
        return case_index(self.settings().cases_dir)

    def case(self, case_id: str) -> tuple[Case, CaseRef]:
        return load_case(case_id, self.settings().cases_dir)


STEP_OUTPUTS = "gate_step_outputs"


class StepOutputs(dg.IOManager):
    """The nightly job's step outputs (plans, chunks, what each chunk played, the scoreboard) as JSON
    in the run store's database, so a step on one machine reads what a step on another wrote: a
    cluster's workers share the database and nothing else (no shared file system)."""

    def __init__(self, gate_store: GateStore):
        self.gate_store = gate_store

    @staticmethod
    def _key(identifier) -> tuple[str, str, str]:
        run_id, step_key, name, *mapping = identifier
        return run_id, step_key, f"{name}[{mapping[0]}]" if mapping else name

    def handle_output(self, context: dg.OutputContext, obj) -> None:
        store = self.gate_store.open(once=True)
        try:
            store.put_output(*self._key(context.get_identifier()), json.dumps(obj, sort_keys=True))
        finally:
            store.dispose()

    def load_input(self, context: dg.InputContext):
        key = self._key(context.upstream_output.get_identifier())
        store = self.gate_store.open(once=True)
        try:
            text = store.get_output(*key)
        except StoreError as exc:
            raise dg.Failure(description=str(exc)) from None
        finally:
            store.dispose()
        if text is None:
            raise dg.Failure(description=f"no stored output {key[2]!r} of step {key[1]!r} in run {key[0]}")
        return json.loads(text)


@dg.io_manager(required_resource_keys={"gate_store"},
               description="The nightly job's step outputs, as JSON in the run store's database.")
def step_outputs(init_context) -> StepOutputs:
    return StepOutputs(init_context.resources.gate_store)


def default_resources() -> dict:
    return {"gate_store": GateStore(), "case_library": CaseLibrary(), STEP_OUTPUTS: step_outputs}
