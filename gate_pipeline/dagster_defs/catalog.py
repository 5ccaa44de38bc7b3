"""What the catalog says about gate's assets: owners, code version, standard table metadata, and the
agents a run may name (an enum in run config, so a mistyped agent is refused at launch).

The agents are those gate knows when the code location loads: the built-ins, installed plugins
(`gate.agents` entry points), the suites' agents, `<agent>@<variant>` for every variant file that
reads, and any names listed in
GATE_AGENTS (e.g. a `module:Class` agent on the code location's path).
"""
from __future__ import annotations

import enum

import dagster as dg

from .. import __version__
from ..kernel.agents import agent_names
from ..kernel.contract import ContractError
from ..kernel.settings import Settings
from ..kernel.variants import load_variant, variant_names
from .location import SETTINGS

OWNERS = ["team:gate"]
CODE_VERSION = __version__  # what computes the assets: the engine, the grader and the agents of this release
WAREHOUSE_TYPES = {"amount": "REAL"}


def known_agents(settings: Settings = SETTINGS) -> list[str]:
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
