"""What the catalog says about gate's assets: owners, code version, standard table metadata, and the
agents a run may name (an enum in run config, so a mistyped agent is refused at launch).

The agents are those gate knows when the code location loads: the built-ins, installed plugins
(`gate.agents` entry points), `careful@<variant>` for every variant file, and any names listed in
GATE_AGENTS (e.g. a `module:Class` agent on the code location's path).
"""
from __future__ import annotations

import enum

import dagster as dg

from .. import __version__
from ..agents import agent_names
from ..settings import Settings

OWNERS = ["team:gate"]
CODE_VERSION = __version__  # what computes the assets: the engine, the grader and the agents of this release
WAREHOUSE_TYPES = {"amount": "REAL"}


def known_agents(settings: Settings | None = None) -> list[str]:
    from ..variants import variant_names
    settings = settings or Settings.from_env()
    names = [*agent_names(), *(f"careful@{v}" for v in variant_names(settings.contracts_dir)), *settings.extra_agents]
    return list(dict.fromkeys(names))


AgentName = enum.Enum("AgentName", {name: name for name in known_agents()})


def table_metadata(name: str, columns, rows: int) -> dict:
    """The standard table metadata Dagster's catalog shows: name, row count, column schema."""
    return {"dagster/table_name": name, "dagster/row_count": rows,
            "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn(c, WAREHOUSE_TYPES.get(c, "TEXT"))
                                                             for c in columns])}
