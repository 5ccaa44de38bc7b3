"""What a suite is to the kernel, and the registry every surface asks for one.

A suite is a set of case families with everything that differs from one set to another: its
vocabulary (tables, columns, defect types), its tools, how a case is checked, prepared and
played, how an episode is graded and shaped, how its case files are generated, what its
contract finds in a batch, its agents and its prompt. A `Suite` holds all of it; the kernel
(engine, actions, ledger, records, sandbox, settings) knows nothing else about any suite.

Suites are found, in this order: the `gate.suites` entry-point group of every installed
package (gate's own suites are registered there by its `pyproject.toml`), then the modules
named by `GATE_SUITES` (`module:attribute`, comma-separated), then `register(suite)` calls. A
case names its suite with a `"suite"` key; a case without one belongs to the suite that says
`default=True`.
"""
from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Iterable, Mapping

from .errors import GateError

ENTRY_POINT_GROUP = "gate.suites"
# the revenue mart of a warehouse: orders joined to their customers (a suite with other tables says its own)
MART_SQL = ("SELECT COALESCE(SUM(o.amount), 0) FROM wh_orders o "
            "JOIN wh_customers c ON o.customer_id = c.customer_id")
ARG_CHARS = 200  # a batch id, column, defect type or listed id longer than this is refused
LIST_ITEMS = 1_000


class UnknownSuite(GateError, ValueError):
    """A suite name (a case's `suite`, a flag, a setting) that no registered suite has."""


@dataclass(frozen=True)
class Arg:
    """One argument of a tool: its name, kind ("str" or "strlist"), what a model is told of it, and the
    most characters a string may have (None: the tool bounds it itself, as run_sql bounds its query)."""
    name: str
    kind: str
    description: str
    limit: int | None = ARG_CHARS
    enum: str | None = None  # "defect_types": the schema a model sees lists the suite's defect types


@dataclass(frozen=True)
class Tool:
    """One tool of a suite's episodes. `shaped` is the dense reward's action type for it (DESCRIBE, SAMPLE
    or QUERY); a decision (a load, a quarantine, the report) is never shaped and has None."""
    name: str
    description: str
    args: tuple[Arg, ...] = ()
    shaped: str | None = "DESCRIBE"

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)


@dataclass(frozen=True)
class Metric:
    """A figure a suite's grades carry beyond the rubric (`Grade.metrics[key]`), and how tables total it."""
    key: str
    label: str
    total: str = "sum"  # "sum" or "mean"
    short: str = ""  # the column head where space is short (the attacker table)


@dataclass(frozen=True, eq=False)
class Suite:
    """Everything the kernel and the surfaces need of one suite; see the module docstring.

    The callables' contracts:
    - `check_case(obj, where)`, `check_batch(batch, where)`, `check_rest(obj, where)`: raise
      `CaseError` for what the suite's case format does not allow (the kernel checks the keys,
      ids, tables and texts every suite shares first, see `kernel.cases`);
    - `validate_contract(doc, where)`: the contract document or `ContractError`;
    - `generate(out_dir, contracts_dir, rows, splits)`: the paths of the case files written;
    - `findings(prepared)`: per batch, what the suite's contract finds (`kernel.world.BatchFindings`),
      judged as gate's checks judge it, without truth labels.
    """
    name: str
    description: str
    families: tuple[str, ...]
    columns: Mapping[str, tuple[str, ...]]
    defect_types: tuple[str, ...]
    tools: tuple[Tool, ...]
    prepared_case: type
    episode: type
    rubric: Any
    case_keys: tuple[str, ...]
    batch_keys: tuple[str, ...]
    check_case: Callable[[dict, str], None]
    check_batch: Callable[[dict, str], None]
    validate_contract: Callable[[Any, str], dict]
    generate: Callable[..., list]
    findings: Callable[[Any], list]
    prompt: str
    agents: Mapping[str, str] = field(default_factory=dict)  # agent name -> "module:Class"
    report_agents: tuple[str, ...] = ()
    attack_agents: tuple[str, ...] = ()
    target: str = ""
    check_rest: Callable[[dict, str], None] | None = None
    default: bool = False
    rows: tuple[int, int, int] | None = None  # (least, most, default) rows per batch `generate` takes
    rule_keys: tuple[str, ...] = ()  # the rules a contract-schema variant may remove
    variant_agent: str = ""  # the agent a variant of this suite's contract applies to
    variant_overrides: Mapping[str, Any] = field(default_factory=dict)  # section -> {key: type}
    key_columns: Mapping[str, str] = field(default_factory=dict)  # table -> the column naming a row
    references: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # table -> the tables its rows refer to
    mart_sql: str = MART_SQL  # the one number the night's loads decide (the grader compares it with a correct run's)
    metrics: tuple[Metric, ...] = ()

    @property
    def tool_names(self) -> tuple[str, ...]:
        cached = self.__dict__.get("_tool_names")  # asked at every tool call a model makes: made once
        if cached is None:
            cached = tuple(t.name for t in self.tools)
            object.__setattr__(self, "_tool_names", cached)
        return cached

    def tool(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def _tools(self) -> dict[str, Tool]:
        cached = self.__dict__.get("_tool_index")
        if cached is None:
            cached = {t.name: t for t in self.tools}
            object.__setattr__(self, "_tool_index", cached)
        return cached


def assemble(*, contract, cases, generator, world, tools, grader, findings, prompt, rules, **fields) -> Suite:
    """A `Suite` from the modules of a suite's folder, by the names every folder defines (docs/architecture.md,
    "Adding a suite"): contract COLUMNS, DEFECT_TYPES, KEY_COLUMNS, validate_contract; cases CASE_KEYS,
    BATCH_KEYS, check_case, check_batch (check_rest if it has one); generator FAMILIES, generate (ROWS if its
    sizes scale); world PREPARED_CASE; tools TOOLS, EPISODE; grader RUBRIC; findings findings; prompt
    SYSTEM_PROMPT; rules RULE_KEYS. `fields` are the rest (name, description, agents, ...)."""
    return Suite(families=generator.FAMILIES, columns=contract.COLUMNS, defect_types=contract.DEFECT_TYPES,
                 key_columns=contract.KEY_COLUMNS, validate_contract=contract.validate_contract,
                 case_keys=cases.CASE_KEYS, batch_keys=cases.BATCH_KEYS, check_case=cases.check_case,
                 check_batch=cases.check_batch, check_rest=getattr(cases, "check_rest", None),
                 generate=generator.generate, rows=getattr(generator, "ROWS", None), prepared_case=world.PREPARED_CASE,
                 tools=tools.TOOLS, episode=tools.EPISODE, rubric=grader.RUBRIC, findings=findings.findings,
                 prompt=prompt.SYSTEM_PROMPT, rule_keys=tuple(rules.RULE_KEYS), **fields)


class Registry:
    """The suites this process knows, by name, in the order they were found."""

    def __init__(self):
        self._suites: dict[str, Suite] = {}
        self._loaded = False
        self._lock = threading.RLock()

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.value.split(":")[0], ep.name))
            for ep in found:
                try:
                    suite = ep.load()
                except Exception as exc:  # a broken plugin is that plugin's problem, named, not a crash
                    raise UnknownSuite(f"suite {ep.name!r}: its entry point {ep.value} cannot be loaded ({exc})") \
                        from None
                self._add(suite, f"entry point {ep.value}")
            self._loaded = True

    def _add(self, suite, where: str) -> Suite:
        if not isinstance(suite, Suite):
            raise UnknownSuite(f"{where} is not a gate Suite (it is {type(suite).__name__})")
        known = self._suites.get(suite.name)
        if known is not None and known is not suite:
            raise UnknownSuite(f"{where}: a suite named {suite.name!r} is registered already")
        if suite.default and any(s.default and s.name != suite.name for s in self._suites.values()):
            raise UnknownSuite(f"{where}: suite {suite.name!r} says it is the default; "
                               f"{self.default().name!r} is already")
        self._suites[suite.name] = suite
        return suite

    def register(self, suite: Suite) -> Suite:
        """Add a suite (its name must be new); returns it."""
        with self._lock:
            self._load()
            return self._add(suite, f"suite {getattr(suite, 'name', suite)!r}")

    def unregister(self, name: str) -> None:
        with self._lock:
            self._suites.pop(name, None)

    def add_modules(self, targets: Iterable[str]) -> None:
        """Register the suites named `module:attribute` (GATE_SUITES), each once."""
        for target in targets:
            module, _, attr = target.partition(":")
            try:
                obj = importlib.import_module(module)
                for part in (attr or "SUITE").split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as exc:
                raise UnknownSuite(f"GATE_SUITES: cannot import {target} ({exc})") from None
            except Exception as exc:  # noqa: BLE001  (a relative name, or a module that fails as it loads)
                raise UnknownSuite(f"GATE_SUITES: cannot import {target} ({type(exc).__name__}: {exc})") from None
            with self._lock:
                self._load()
                self._add(obj, f"GATE_SUITES entry {target}")

    def names(self) -> list[str]:
        self._load()
        return list(self._suites)

    def all(self) -> list[Suite]:
        self._load()
        return list(self._suites.values())

    def get(self, name) -> Suite:
        self._load()
        suite = self._suites.get(name) if isinstance(name, str) else None
        if suite is None:
            raise UnknownSuite(f"unknown suite {str(name)[:60]!r}; suites: {', '.join(self._suites) or 'none'}")
        return suite

    def default(self) -> Suite:
        self._load()
        for suite in self._suites.values():
            if suite.default:
                return suite
        raise UnknownSuite("no default suite is registered (is gate installed? `pip install -e .`)")

    def of_data(self, obj) -> Suite:
        """The suite of a case's JSON object: the one its "suite" names, else the default suite."""
        if isinstance(obj, dict) and "suite" in obj:
            name = obj["suite"]
            suite = self._suites.get(name) if isinstance(name, str) else None
            if suite is None:
                self._load()
                suite = self._suites.get(name) if isinstance(name, str) else None
            if suite is None or suite.default:  # a default-suite case carries no "suite" key
                raise UnknownSuite(f"'suite' must be one of {[s.name for s in self.all() if not s.default]} "
                                   f"(a {self.default().name} case has no 'suite'), not {str(name)[:40]!r}")
            return suite
        return self.default()

    def of_family(self, family: str) -> Suite | None:
        for suite in self.all():
            if family in suite.families:
                return suite
        return None


suites = Registry()


def suite_named(name: str) -> Suite:
    return suites.get(name)


def family_order(families) -> list[str]:
    """Families in their suites' order (suites as registered), any others after them alphabetically."""
    present = set(families)
    known = [f for s in suites.all() for f in s.families]
    return [f for f in dict.fromkeys(known) if f in present] + sorted(present - set(known))
