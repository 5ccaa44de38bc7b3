"""What the catalog says about gate's assets: owners, code version, standard table metadata, and the
agents a run may name (an enum in run config, so a mistyped agent is refused at launch).

The agents are those gate knows when the code location loads: the built-ins, installed plugins
(`gate.agents` entry points), `careful@<variant>` (`careful-v2@<variant>` for a suite v2 variant) for
every variant file that reads, and any names listed in
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
    from ..contract import ContractError
    from ..variants import load_variant, variant_names
    settings = settings or Settings.from_env()
    variants = []
    for name in variant_names(settings.contracts_dir):
        try:  # a broken variant file is not offered (the CLI names its fault); the location still loads
            variants.append(f"{load_variant(name, settings.contracts_dir).agent}@{name}")
        except (ContractError, OSError):
            continue
    return list(dict.fromkeys([*agent_names(), *variants, *settings.extra_agents]))


AgentName = enum.Enum("AgentName", {name: name for name in known_agents()})


def table_metadata(name: str, columns, rows: int) -> dict:
    """The standard table metadata Dagster's catalog shows: name, row count, column schema."""
    return {"dagster/table_name": name, "dagster/row_count": rows,
            "dagster/column_schema": dg.TableSchema(columns=[dg.TableColumn(c, WAREHOUSE_TYPES.get(c, "TEXT"))
                                                             for c in columns])}
