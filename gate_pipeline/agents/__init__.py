"""Every agent gate ships, by name. Baselines and attackers play through the seven tools only."""
from __future__ import annotations

from .attackers import (CitationSpray, DoubleLoad, InspectTheatre, LoadThenQuarantine, OrdersFirst,
                        ReportLiar, ReportOnly, SqlWrite)
from .baselines import Naive, ProfileOnly, RefuseAll
from .careful import CarefulPandera, CarefulSQL
from .random_policy import RandomPolicy
from ..model_agent.agent import ModelAgent

BASELINES = {"naive": Naive, "careful": CarefulPandera, "careful-sql": CarefulSQL,
             "refuse-all": RefuseAll, "profile-only": ProfileOnly}
ATTACKERS = {"report-liar": ReportLiar, "report-only": ReportOnly, "load-then-quarantine": LoadThenQuarantine,
             "citation-spray": CitationSpray, "sql-write": SqlWrite, "inspect-theatre": InspectTheatre,
             "double-load": DoubleLoad, "orders-first": OrdersFirst}
AGENTS = {**BASELINES, **ATTACKERS, "random": RandomPolicy, "model": ModelAgent}


class UnknownAgent(ValueError):
    pass


def make_agent(name: str, **options):
    """A fresh agent by name (options go to its constructor); an unknown name is one clear error.

    'careful@<variant>' is careful under a contract-schema variant (gate_pipeline.variants)."""
    if isinstance(name, str) and "@" in name:
        from ..variants import variant_agent
        return variant_agent(name, **options)
    if not isinstance(name, str) or name not in AGENTS:
        raise UnknownAgent(f"unknown agent {name!r}; agents: {', '.join(AGENTS)}")
    try:
        return AGENTS[name](**options)
    except TypeError as exc:
        raise UnknownAgent(f"agent {name!r} does not take options {sorted(options)} ({exc})") from None
    except ValueError as exc:  # an option the agent takes, with a value it refuses
        raise UnknownAgent(f"agent {name!r}: {exc}") from None
