"""What an agent is to gate, and agents by name.

An agent is any object with `play(tools, case=None)` (or `play_async`). `tools(name, **args)`
returns exactly what the tool returns to any agent; `tools.act(action)` takes an action in any
spelling `actions.py` accepts; `tools.episode_seed` is a number fixed by the case, for agents
that draw at random; `tools.suite` is the episode's suite (its vocabulary and tools, no labels).
Only oracle agents (their class says `oracle = True`, read when the spec is made) are also handed the case's
JSON object, truth labels included.

`resolve_agent(name, options)` checks a name and its options once and returns an `AgentSpec`;
the engine builds a fresh agent from the spec for every episode (nothing an agent keeps carries
over from one episode to the next). A name is

- an agent of a registered suite (`Suite.agents`: careful, careful-v2, the attackers...);
- an entry point in the `gate.agents` group of an installed package (gate's own suite-free
  agents, naive, refuse-all, random and model, are registered there too);
- `<agent>@<variant>`: a suite's careful agent under a contract-schema variant (`kernel.variants`);
- `package.module:Class`: a class that defines `play(tools, case=None)` (or `play_async`).

A name is never called blindly: what it names must be a class that defines `play` or `play_async`
(a suite's agent, an entry point, `module:Class`), checked before anything is built, so a name such
as `os:system` is refused without being called. An unknown name raises `UnknownAgent`; options the
agent does not take, or values it refuses, raise `AgentOptionError`. Both say what would have been
accepted.

**Deterministic agents** give the same episode every time they play a case (`gate verify` plays
them again to check a stored episode): every agent of gate and of a registered suite, and
`variant` agents, unless the class says `deterministic = False` (the model agent does); a plugin's
agent (an entry point of another package, or `module:Class`) only when its class says
`deterministic = True`.
"""
from __future__ import annotations

import importlib
import inspect
import reprlib
import sys
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any, Callable, Protocol

from .errors import AgentOptionError, RepeatedAgent, UnknownAgent
from .suite import suites
from .variants import variant_agent_factory

ENTRY_POINT_GROUP = "gate.agents"
MAX_NAME_CHARS = 500  # an agent name (`module:Class`, `name@variant`)


class AgentUnfinished(Exception):
    """Raised by an agent that stops without finishing its episode for a reason of its own (a model
    agent out of turns, or whose server never answered); `end_reason` names the reason
    (records.MAX_TURNS, TIMEOUT, API_ERROR...). The episode grades 0 with the message."""

    def __init__(self, end_reason: str, message: str):
        super().__init__(message)
        self.end_reason = end_reason


class Tools(Protocol):
    """What an agent plays through (the engine's, or a wrapper's: it must offer all of these)."""
    episode_seed: int
    suite: Any  # the episode's Suite: its vocabulary and tools
    tool_names: tuple[str, ...]

    def __call__(self, name: str, **args) -> Any: ...

    def act(self, action) -> Any: ...


class Agent(Protocol):
    name: str
    oracle: bool

    def play(self, tools: Tools, case: dict | None = None) -> None: ...


def customers_first(listing: list[dict]) -> list[dict]:
    """The load order every careful agent uses: customers batches first, then by batch id."""
    return sorted(listing, key=lambda b: (b["table"] != "customers", b["batch_id"]))


@dataclass(frozen=True)
class AgentSpec:
    """A checked agent name with its options: what the engine builds one agent per episode from.

    `identity` is how the agent is named in every table, store and transcript: the name as
    given, except for agents that name themselves by an option (a model agent: its model)."""
    name: str
    options: dict = field(default_factory=dict)
    factory: Callable[..., Any] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    identity: str = ""
    deterministic: bool = False  # plays a case the same way every time (module docstring)
    # handed the case's labels: its class says so (`oracle = True`), read here, when the spec is made, so an agent
    # cannot make itself one once built (an instance or its __init__ setting the flag changes nothing)
    oracle: bool | None = None

    def __post_init__(self):
        if self.oracle is None:
            object.__setattr__(self, "oracle", getattr(self.factory, "oracle", False) is True)

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
        unknown = sorted(str(k) for k in set(options) - set(accepted))
        if unknown:
            return (f"agent {name!r} does not take option {unknown[0]!r}; "
                    f"it takes {', '.join(accepted) if accepted else 'no options'}")
    return f"agent {name!r}: bad options {sorted(options)} ({exc})"


def import_target(target: str, name: str):
    """The object `module:attribute` names; an UnknownAgent naming `name` when it cannot be imported."""
    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UnknownAgent(f"agent {name!r}: cannot import {target} ({exc})") from None
    except Exception as exc:  # noqa: BLE001  (a relative name, ':x' or '.:x', or a module that fails as it loads)
        raise UnknownAgent(f"agent {name!r}: cannot import {target} ({type(exc).__name__}: {exc})") from None
    return obj


@lru_cache(maxsize=1)
def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _suite_agents() -> dict[str, str]:
    out: dict[str, str] = {}
    for suite in suites.all():
        for name, target in suite.agents.items():
            out.setdefault(name, target)
    return out


def agent_names() -> list[str]:
    """Every agent name gate knows: gate's own and installed plugins (entry points), then the suites'."""
    others = sorted(n for n, ep in _entry_points().items() if not ep.value.startswith("gate_pipeline."))
    return list(dict.fromkeys([*gates_own_agent_names(), *others]))


def _is_agent_class(obj) -> bool:
    """A class that defines `play` or `play_async` (inherited counts): checked without calling anything."""
    return inspect.isclass(obj) and any(callable(inspect.getattr_static(obj, m, None)) for m in ("play", "play_async"))


def _agent_class(obj, name: str, what: str):
    if not _is_agent_class(obj):
        kind = "a class with no play method" if inspect.isclass(obj) else f"a {type(obj).__name__}"
        raise UnknownAgent(f"agent {name!r}: {what} is {kind}, not an agent (a class that defines "
                           f"play(tools, case=None)); nothing was called")
    return obj


def _factory(name: str) -> tuple[Callable[..., Any], bool]:
    """(the agent class a name resolves to, whether gate or a registered suite provides it)."""
    suite_agents = _suite_agents()
    if name in suite_agents:
        return _agent_class(import_target(suite_agents[name], name), name, suite_agents[name]), True
    if ":" in name:
        return _agent_class(import_target(name, name), name, name), False
    plugin = _entry_points().get(name)
    if plugin is not None:
        try:
            obj = plugin.load()
        except Exception as exc:  # a broken plugin is that plugin's error, not a crash
            raise UnknownAgent(f"agent {name!r}: its entry point {plugin.value} cannot be loaded ({exc})") from None
        return _agent_class(obj, name, f"its entry point {plugin.value}"), plugin.value.startswith("gate_pipeline.")
    raise UnknownAgent(f"unknown agent {name!r}; agents: {', '.join(agent_names())}, "
                       f"<agent>@<variant>, or module:Class")


def is_deterministic(factory, builtin: bool) -> bool:
    """Whether an agent plays a case the same way every time: its class says so (`deterministic`), else
    gate's and the suites' agents do and plugins' do not."""
    declared = getattr(factory, "deterministic", None)
    return declared if isinstance(declared, bool) else builtin


def gates_own_agent_names() -> list[str]:
    """The agents gate and its suites provide (the same wherever this version of gate runs; plugins are not)."""
    own = [n for n, ep in _entry_points().items() if ep.value.startswith("gate_pipeline.")]
    return list(dict.fromkeys([*own, *_suite_agents()]))


def is_gates_own(name: str) -> bool:
    """Whether `name` is one of gate's own agents, or one of them under a variant (`careful@full`)."""
    return name.partition("@")[0] in gates_own_agent_names()


def folded(name: str) -> str:
    """A name as a reader tells names apart: its NFKC form, case-folded, without spaces and without the
    characters that show nothing (format and control characters: a zero-width space)."""
    return "".join(c for c in unicodedata.normalize("NFKC", name).casefold()
                   if not c.isspace() and unicodedata.category(c) not in ("Cf", "Cc", "Zs", "Zl", "Zp"))


def _names_an_agent(identity: str) -> str | None:
    """The agent gate knows that `identity` reads as (the agent itself, one of its variants, or an agent class
    `module:Class` names, of a module already loaded or of gate's own), or None."""
    known = {folded(n): n for n in agent_names()}
    text = folded(identity)
    if text in known:
        return known[text]
    base, at, _ = text.partition("@")
    if at and base in known:  # <agent>@<variant>
        return f"{known[base]}@..."
    module, colon, attr = identity.partition(":")
    if colon and all(part.isidentifier() for part in (*module.split("."), *attr.split("."))):
        obj = sys.modules.get(module)  # module:Class, an agent class of a module loaded (or of gate's, loaded now)
        if obj is None and module.split(".")[0] == "gate_pipeline":
            try:
                obj = importlib.import_module(module)
            except Exception:  # noqa: BLE001 - no module of gate's by that name: no agent
                return None
        for part in attr.split("."):
            obj = getattr(obj, part, None) if obj is not None else None
        if _is_agent_class(obj):
            return identity
    return None


def own_identity(name: str, identity: str) -> str:
    """`identity`, the name agent `name` takes from its options (a model agent: its model's), unless it reads as
    another agent's name (AgentOptionError): its case or spaces changed, an invisible character added, a variant
    of it (`<agent>@<variant>`) or a class gate could import (`module:Class`). Every table, store and transcript
    names an agent by its identity, so the two could not be told apart, and `gate verify` plays again an agent
    gate plays the same way every time."""
    other = _names_an_agent(identity) if identity != name else None
    if other is not None:
        shown = "" if other == identity else f" (read as {other!r})"
        raise AgentOptionError(f"agent {name!r} with these options is named {identity!r}{shown}, which is, or reads as, "
                               f"the name of another agent gate knows: the two could not be told apart (name it "
                               f"otherwise)")
    return identity


def resolve_agent(name, options: dict | None = None, contracts=None) -> AgentSpec:
    """Check `name` and `options` (by building the agent once) and return its spec.

    What the name names is checked to be an agent class before anything is called (module docstring).
    `contracts` is where `<agent>@<variant>` finds its variant (default: the shipped contracts)."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownAgent(f"an agent name must be a non-empty string, not {reprlib.repr(name)}")
    if len(name) > MAX_NAME_CHARS:  # every message below quotes it
        raise UnknownAgent(f"an agent name is at most {MAX_NAME_CHARS} characters, not {len(name):,} "
                           f"({reprlib.repr(name)})")
    options = dict(options or {})
    if "@" in name and ":" not in name:
        factory, builtin = variant_agent_factory(name, contracts), True  # gate's own careful, under a variant
    else:
        factory, builtin = _factory(name)
    naming = getattr(factory, "identity", None)
    identity = naming(options) if callable(naming) else name
    identity = own_identity(name, identity if isinstance(identity, str) and identity else name)
    spec = AgentSpec(name, options, factory, identity, is_deterministic(factory, builtin))
    agent = spec.build()
    if not callable(getattr(agent, "play", None)) and not callable(getattr(agent, "play_async", None)):
        raise UnknownAgent(f"agent {name!r} has no play(tools, case=None) method")
    return spec


def resolve_agents(names, options: dict | None = None, contracts=None) -> list[AgentSpec]:
    """`resolve_agent` of each name, with its options (`options[name]`); RepeatedAgent when two are one agent.
    Options are for agents played: an entry for any other (a misspelt name) would be dropped without a word, and
    the agent it meant played without them, so it is refused (AgentOptionError), once the names are checked."""
    options = options or {}
    specs = unique_agents([resolve_agent(name, options.get(name), contracts=contracts) for name in names])
    stray = [str(key) for key in options if key not in names]
    if stray:
        raise AgentOptionError(f"options are given for agent {stray[0][:80]!r}, which is not one of the agents "
                               f"played ({', '.join(map(str, names))[:200]})")
    return specs


def unique_agents(specs: list[AgentSpec]) -> list[AgentSpec]:
    """`specs`, refused (RepeatedAgent) when two are one agent: a batch keeps each agent's results by its
    identity, so one named twice played every case twice and graded the first cases twice in place of the rest."""
    seen: set[str] = set()
    for spec in specs:
        if spec.identity in seen:
            raise RepeatedAgent(f"agent {spec.identity!r} is named twice: each agent plays each case once")
        seen.add(spec.identity)
    return specs


def make_agent(name: str, **options):
    """One agent by name, shipped contracts (for code that plays it outside the engine, e.g. tests)."""
    return resolve_agent(name, options).build()
