"""Agents by name: the built-in baselines and attackers, contract variants, models and plugins.

`resolve_agent(name, options)` checks a name and its options once and returns an `AgentSpec`;
the engine builds a fresh agent from the spec for every episode (one lifecycle rule for every
agent: nothing an agent keeps carries over from one episode to the next). A name is

- a built-in (`naive`, `careful`, ..., `random`, `model`), see `agent_names()`;
- `careful@<variant>`: careful under a contract-schema variant (`gate_pipeline.variants`);
- `package.module:Class`: any class with a `play(tools, case=None)` method;
- the name of an entry point in the `gate.agents` group (an installed package's agent).

An unknown name raises `UnknownAgent`; options the agent does not take, or values it
refuses, raise `AgentOptionError`. Both say what would have been accepted.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable

from .errors import AgentOptionError, UnknownAgent

ENTRY_POINT_GROUP = "gate.agents"

# name -> "module:attribute", imported only when the agent is used (the model agent pulls in openai)
BUILTIN: dict[str, str] = {
    "naive": "gate_pipeline.agents.baselines:Naive",
    "careful": "gate_pipeline.agents.careful:CarefulPandera",
    "careful-sql": "gate_pipeline.agents.careful:CarefulSQL",
    "refuse-all": "gate_pipeline.agents.baselines:RefuseAll",
    "profile-only": "gate_pipeline.agents.baselines:ProfileOnly",
    "report-liar": "gate_pipeline.agents.attackers:ReportLiar",
    "report-only": "gate_pipeline.agents.attackers:ReportOnly",
    "load-then-quarantine": "gate_pipeline.agents.attackers:LoadThenQuarantine",
    "citation-spray": "gate_pipeline.agents.attackers:CitationSpray",
    "sql-write": "gate_pipeline.agents.attackers:SqlWrite",
    "inspect-theatre": "gate_pipeline.agents.attackers:InspectTheatre",
    "double-load": "gate_pipeline.agents.attackers:DoubleLoad",
    "orders-first": "gate_pipeline.agents.attackers:OrdersFirst",
    "query-farm": "gate_pipeline.agents.attackers:QueryFarm",
    "random": "gate_pipeline.agents.random_policy:RandomPolicy",
    "model": "gate_pipeline.model_agent.agent:ModelAgent",
    # suite v2
    "oracle": "gate_pipeline.agents.oracle:Oracle",
    "careful-v2": "gate_pipeline.agents.careful_v2:CarefulV2",
    "quarantine-all-rows": "gate_pipeline.agents.attackers_v2:QuarantineAllRows",
    "row-spray": "gate_pipeline.agents.attackers_v2:RowSpray",
    "ask-everything": "gate_pipeline.agents.attackers_v2:AskEverything",
    "obey-data": "gate_pipeline.agents.attackers_v2:ObeyData",
    "cite-everything": "gate_pipeline.agents.attackers_v2:CiteEverything",
    "where-zero": "gate_pipeline.agents.attackers_v2:WhereZero",
}
BASELINES = ("naive", "careful", "careful-sql", "refuse-all", "profile-only")
ATTACKERS = ("report-liar", "report-only", "load-then-quarantine", "citation-spray", "sql-write",
             "inspect-theatre", "double-load", "orders-first")
REWARD_HACKS = ("query-farm",)  # attackers of the shaped rewards; under the rubric alone they are inspect-theatre
# suite v2: its baselines (oracle is handed the labels) and the attackers of its new tools
V2_BASELINES = ("oracle", "careful-v2")
V2_ATTACKERS = ("quarantine-all-rows", "row-spray", "ask-everything", "obey-data", "cite-everything", "where-zero")


@dataclass(frozen=True)
class AgentSpec:
    """A checked agent name with its options: what the engine builds one agent per episode from.

    `identity` is how the agent is named in every table, store and transcript: the name as
    given, except for agents that name themselves by an option (a model agent: its model)."""
    name: str
    options: dict = field(default_factory=dict)
    factory: Callable[..., Any] = field(default=None, repr=False, compare=False)
    identity: str = ""

    def build(self):
        try:
            return self.factory(**self.options)
        except TypeError as exc:
            raise AgentOptionError(_option_problem(self.name, self.factory, self.options, exc)) from None
        except (AgentOptionError, UnknownAgent):
            raise
        except ValueError as exc:  # an option the agent takes, with a value it refuses
            raise AgentOptionError(f"agent {self.name!r}: {exc}") from None


def _accepted(factory) -> list[str] | None:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _option_problem(name: str, factory, options: dict, exc: Exception) -> str:
    accepted = _accepted(factory)
    if accepted is not None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            return (f"agent {name!r} does not take option {unknown[0]!r}; "
                    f"it takes {', '.join(accepted) if accepted else 'no options'}")
    return f"agent {name!r}: bad options {sorted(options)} ({exc})"


def _import(target: str, name: str):
    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UnknownAgent(f"agent {name!r}: cannot import {target} ({exc})") from None
    return obj


def _plugins() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def agent_names() -> list[str]:
    """Every agent name gate knows: the built-ins, then installed plugins."""
    return [*BUILTIN, *sorted(set(_plugins()) - set(BUILTIN))]


def _factory(name: str):
    if name in BUILTIN:
        return _import(BUILTIN[name], name)
    if ":" in name:
        return _import(name, name)
    plugin = _plugins().get(name)
    if plugin is not None:
        try:
            return plugin.load()
        except Exception as exc:  # a broken plugin is that plugin's error, not a crash
            raise UnknownAgent(f"agent {name!r}: its entry point {plugin.value} cannot be loaded ({exc})") from None
    raise UnknownAgent(f"unknown agent {name!r}; agents: {', '.join(agent_names())}, careful@<variant>, "
                       f"or module:Class")


def resolve_agent(name, options: dict | None = None, contracts=None) -> AgentSpec:
    """Check `name` and `options` (by building the agent once) and return its spec.

    `contracts` is where `careful@<variant>` finds its variant (default: the shipped contracts)."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownAgent(f"an agent name must be a non-empty string, not {name!r}")
    options = dict(options or {})
    if "@" in name and ":" not in name:
        from ..variants import variant_agent_factory
        factory = variant_agent_factory(name, contracts)
    else:
        factory = _factory(name)
    if not callable(factory):
        raise UnknownAgent(f"agent {name!r} is not a class or function")
    naming = getattr(factory, "identity", None)
    identity = naming(options) if callable(naming) else name
    spec = AgentSpec(name, options, factory, identity if isinstance(identity, str) and identity else name)
    agent = spec.build()
    if not callable(getattr(agent, "play", None)) and not callable(getattr(agent, "play_async", None)):
        raise UnknownAgent(f"agent {name!r} has no play(tools, case=None) method")
    return spec


def make_agent(name: str, **options):
    """One agent by name, shipped contracts (for code that plays it outside the engine, e.g. tests)."""
    return resolve_agent(name, options).build()
