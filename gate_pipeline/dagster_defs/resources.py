"""Resources: where runs are stored (GATE_HOME, the run-store URL) and where cases are read.

Both default to environment settings (GATE_HOME, GATE_DB_URL, GATE_CASES_DIR) and then to
`.gate/` and `cases/` in the working directory, so the webserver, the daemon and an
in-process run started from the repository root all share one store.
"""
from __future__ import annotations

from typing import Optional

import dagster as dg

from ..store import RunStore, StoreError
from .partitions import CaseIndex, CaseRef, case_index, load_case


class GateStore(dg.ConfigurableResource):
    """The run store: warehouses as SQLite files under `home`, ledgers and grades at `db_url`."""

    home: Optional[str] = None
    db_url: Optional[str] = None

    def open(self) -> RunStore:
        try:
            return RunStore(self.home, self.db_url)
        except StoreError as exc:  # a bad setting is one clear failure, not a traceback
            raise dg.Failure(description=str(exc)) from None


class CaseLibrary(dg.ConfigurableResource):
    """The case files (every `*.jsonl` under `cases_dir`)."""

    cases_dir: Optional[str] = None

    def index(self) -> CaseIndex:
        return case_index(self.cases_dir)

    def case(self, case_id: str) -> tuple[dict, CaseRef]:
        return load_case(case_id, self.cases_dir)


def default_resources() -> dict:
    return {"gate_store": GateStore(), "case_library": CaseLibrary()}
