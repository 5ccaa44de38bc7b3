"""Resources: where runs are stored (GATE_HOME, the run-store URL) and where cases and contracts
are read (GATE_CASES_DIR, GATE_CONTRACTS).

Each field left unset takes its value from `settings.Settings.from_env()`, so the webserver,
the daemon and an in-process run share one store and one case library.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import dagster as dg

from ..settings import Settings
from ..store import RunStore, StoreError
from .partitions import CaseIndex, CaseRef, case_index, load_case


class GateStore(dg.ConfigurableResource):
    """The run store: warehouses as SQLite files under `home`, ledgers and grades at `db_url`."""

    home: Optional[str] = None
    db_url: Optional[str] = None

    def settings(self) -> Settings:
        base = Settings.from_env()
        return dataclasses.replace(base, home=Path(self.home).resolve() if self.home else base.home,
                                   db_url=self.db_url or base.db_url)

    def open(self) -> RunStore:
        try:
            return RunStore(self.settings())
        except StoreError as exc:  # a bad setting is one clear failure, not a traceback
            raise dg.Failure(description=str(exc)) from None


class CaseLibrary(dg.ConfigurableResource):
    """The case files (every `*.jsonl` under `cases_dir`) and the contracts (`contracts_dir`)."""

    cases_dir: Optional[str] = None
    contracts_dir: Optional[str] = None

    def settings(self) -> Settings:
        base = Settings.from_env()
        return dataclasses.replace(
            base, cases_dir=Path(self.cases_dir).resolve() if self.cases_dir else base.cases_dir,
            contracts_dir=Path(self.contracts_dir).resolve() if self.contracts_dir else base.contracts_dir)

    def index(self) -> CaseIndex:
        return case_index(self.settings().cases_dir)

    def case(self, case_id: str) -> tuple[dict, CaseRef]:
        return load_case(case_id, self.settings().cases_dir)


def default_resources() -> dict:
    return {"gate_store": GateStore(), "case_library": CaseLibrary()}
