"""One play of one case: the tools over a world, the only way an agent touches an episode.

`Episode.call(tool, args)` checks the call against the suite's tools (an unknown tool or a wrong
argument is refused, never coerced), writes the ledger entry (refused calls included; a load's
entry before its effect) and returns the JSON value the agent sees: the result, or
`{"error": ...}`. The seven tools every suite has are here; a suite's subclass builds its world
and adds its own tools as methods named after them, with the refusals its vocabulary needs.
"""
from __future__ import annotations

import json
import sqlite3

from .actions import Action, ledger_repr
from .errors import NoRoom
from .sandbox import CAUGHT, bounded, normalise_query, raise_swallowed, too_long
from .suite import LIST_ITEMS, Suite
from .world import PreparedCase, World

LOADED_WARNING = "already loaded - quarantine does not remove loaded rows"
TOOL_NAME_CHARS = 100


def tool_name(tool) -> str:
    """A tool name as the ledger keeps it: text, and bounded (the agent chose it)."""
    name = tool if isinstance(tool, str) else "?" if tool is None else ledger_repr(tool)
    return name if len(name) <= TOOL_NAME_CHARS else name[:TOOL_NAME_CHARS] + "...[truncated]"


class _Shape:
    """What `check_args` needs of a suite's tools, computed once per suite."""
    __slots__ = ("names", "strings", "tools")

    def __init__(self, suite: Suite):
        self.tools = {t.name: t for t in suite.tools}
        self.names = {t.name: frozenset(t.arg_names) for t in suite.tools}
        # tools whose arguments are all strings: name -> ((argument, limit), ...), decided quickly
        self.strings = {t.name: tuple((a.name, a.limit) for a in t.args) for t in suite.tools
                        if all(a.kind == "str" for a in t.args)}


_SHAPES: dict[int, tuple[Suite, _Shape]] = {}


def _shape(suite: Suite) -> _Shape:
    known = _SHAPES.get(id(suite))
    if known is None or known[0] is not suite:
        known = _SHAPES[id(suite)] = (suite, _Shape(suite))
    return known[1]


def check_args(suite: Suite, tool: str, args) -> str | None:
    """The refusal text for malformed arguments to one of `suite`'s tools, or None when well formed."""
    return _check(_shape(suite), tool, args)


def _check(shape: _Shape, tool: str, args) -> str | None:
    strings = shape.strings.get(tool)
    if strings is not None and type(args) is dict and len(args) == len(strings):
        for name, limit in strings:  # the common case, decided quickly: every argument there, text, short enough
            value = args.get(name)
            if type(value) is not str or (limit is not None and len(value) > limit):
                break
        else:
            return None
    if not isinstance(args, dict):
        return f"{tool}: arguments must be an object, not {type(args).__name__}"
    spec = shape.tools[tool]
    names = list(spec.arg_names)
    extra = [k for k in args if k not in names]
    if extra:
        shown = repr(extra[0]) if isinstance(extra[0], str) and len(extra[0]) <= 200 else ledger_repr(extra[0])
        return f"{tool}: unexpected argument {shown}; it takes {names or 'no arguments'}"
    for arg in spec.args:
        name = arg.name
        if name not in args:
            return f"{tool}: missing argument {name!r}"
        value = args[name]
        if arg.kind == "str":
            if not isinstance(value, str):
                return f"{tool}: argument {name!r} must be a string, not {type(value).__name__}"
            if arg.limit is not None and len(value) > arg.limit:
                return f"{tool}: argument {name!r} is {len(value):,} characters long; the limit is {arg.limit:,}"
        elif arg.kind == "strlist":
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                return f"{tool}: argument {name!r} must be a list of strings"
            if len(value) > LIST_ITEMS or any(len(v) > (arg.limit or 0) for v in value):
                return f"{tool}: argument {name!r} may list at most {LIST_ITEMS} ids of at most {arg.limit} characters"
    return None


class Episode:
    """One play of one prepared case: its world, its ledger, and its suite's tools over them.

    A suite's subclass sets `world_class` (or overrides `make_world`), and adds one method per tool
    of its own; `citation_problem` and `cite` are its hooks for what a quarantine records."""

    world_class: type = World

    def __init__(self, prepared: PreparedCase, listener=None, deferred_ledger: bool = False):
        self.prepared = prepared
        self.suite: Suite = prepared.suite
        self.world = self.make_world(listener, deferred_ledger)
        self.ledger = self.world.ledger
        self._shape = _shape(self.suite)
        # the machine's failure under a tool call (no room for the database's pages): the episode cannot be
        # graded, whatever the agent does next (`Session.finish` raises it again)
        self.machine_failure: NoRoom | None = None

    def make_world(self, listener, deferred_ledger: bool) -> World:
        return self.world_class(self.prepared, listener, deferred_ledger)

    # -- the one entry point --------------------------------------------------------------
    def call(self, tool, args=None):
        """Run one tool call; returns the JSON value the agent sees."""
        args = {} if args is None else args
        shape = self._shape
        if not isinstance(tool, str) or tool not in shape.names:
            name = tool_name(tool)
            self.ledger.append(name, {"sent": ledger_repr(args)}, False, "unknown tool")
            return {"error": f"unknown tool {name!r}; tools are {list(self.suite.tool_names)}"}
        problem = _check(shape, tool, args)
        if problem:
            self.ledger.append(tool, {"sent": ledger_repr(args)}, False, "bad arguments")
            return {"error": problem}
        if tool not in shape.strings:  # a list the caller may change later: the ledger keeps a copy of it
            args = {name: list(value) if type(value) is list else value for name, value in args.items()}
        try:  # not `gates_own()`: a context manager a call costs 2 % of an episode's instructions
            answer = getattr(self, tool)(**args)
        except sqlite3.Error as exc:  # a statement of gate's own that failed: Ctrl-C's, perhaps
            raise_swallowed(exc)
            room = self.world.no_room(exc)
            if room is None:
                raise
            self.machine_failure = room
            raise room from None
        except NoRoom as exc:
            self.machine_failure = exc
            raise_swallowed()  # Ctrl-C that came while gate's statements failed goes first
            raise
        raise_swallowed()  # Ctrl-C during gate's own statements, which finished
        return answer

    def refuse(self, action: Action):
        """Answer a malformed action (see `actions.parse_action`) and log it like any refused call."""
        self.ledger.append(tool_name(action.tool), {"sent": ledger_repr(action.args)}, False, "malformed action")
        return {"error": action.problem}

    def close(self) -> None:
        self.world.close()

    # -- refusals the decisions share --------------------------------------------------------
    def citation_problem(self, tool: str, args: dict, batch_id: str, column: str, defect_type: str):
        """The refusal of a citation that names no batch, defect type or column of the batch, or None."""
        if batch_id not in self.prepared.batches:
            self.ledger.append(tool, args, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        if defect_type not in self.suite.defect_types:
            self.ledger.append(tool, args, False, "unknown defect type")
            return {"error": f"defect_type must be one of {list(self.suite.defect_types)}"}
        columns = self.suite.columns[self.prepared.batches[batch_id].table]
        if column not in columns:
            self.ledger.append(tool, args, False, "unknown column")
            return {"error": f"column must be one of {list(columns)}"}
        return None

    def cite(self, batch_id: str, column: str, defect_type: str) -> None:
        """Record a citation beyond the first (a suite that credits several keeps them)."""

    # -- the seven tools ------------------------------------------------------------------
    def read_contract(self):
        self.ledger.append("read_contract", {}, True)
        return json.loads(self.prepared.contract_json)  # a fresh copy every call

    def list_batches(self):
        self.ledger.append("list_batches", {}, True)
        return [dict(item) for item in self.prepared.listing]

    def profile_batch(self, batch_id):
        known = batch_id in self.prepared.batches
        self.ledger.append("profile_batch", {"batch_id": batch_id}, known)
        if not known:
            return {"error": f"no batch {batch_id!r}"}
        return self.prepared.profile(batch_id)

    def run_sql(self, query):
        refusal = too_long(query)
        if refusal:
            self.ledger.append("run_sql", {"query": bounded(query)}, False, "query too long")
            return {"error": refusal}
        query = normalise_query(query)
        try:
            result, tables, extra = self.world.sandbox.run(query)
        except CAUGHT as exc:
            self.world.restore()  # the query's error, and only that: what SQLite undid with it is put back
            self.ledger.append("run_sql", {"query": query}, False, type(exc).__name__)
            return {"error": str(exc)}
        self.world.restore()  # a look check's run that failed, the same
        self.ledger.append("run_sql", {"query": query, "tables_read": tables, **extra}, True)
        return result

    def load_entry(self, batch_id: str, rows: int, orphans: int) -> dict:
        """The arguments a load's ledger entry records."""
        return {"batch_id": batch_id, "rows": rows, "orphan_rows": orphans}

    def load_result(self, batch_id: str, rows: int) -> dict:
        return {"status": "loaded", "rows_loaded": rows, "errors": 0}

    def load_batch(self, batch_id):
        world = self.world
        if batch_id not in self.prepared.batches:
            self.ledger.append("load_batch", {"batch_id": batch_id}, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        if batch_id in world.quarantined:
            self.ledger.append("load_batch", {"batch_id": batch_id}, False, "quarantined")
            return {"error": f"{batch_id} is quarantined"}
        orphans = world.orphan_rows(batch_id)
        rows = world.rows_to_load(batch_id)
        self.ledger.append("load_batch", self.load_entry(batch_id, rows, orphans), True)
        if orphans:
            world.orphans_at_load[batch_id] = max(world.orphans_at_load.get(batch_id, 0), orphans)
        world.load(batch_id)
        world.loads[batch_id] = world.loads.get(batch_id, 0) + 1
        return self.load_result(batch_id, rows)

    def quarantine_batch(self, batch_id, column, defect_type):
        world = self.world
        args = {"batch_id": batch_id, "column": column, "defect_type": defect_type}
        problem = self.citation_problem("quarantine_batch", args, batch_id, column, defect_type)
        if problem:
            return problem
        if batch_id in world.quarantined:
            self.ledger.append("quarantine_batch", args, False, "already quarantined")
            return {"error": f"{batch_id} is already quarantined; the first citation stands"}
        warning = LOADED_WARNING if world.loads.get(batch_id) else ""
        self.ledger.append("quarantine_batch", args, True, warning)
        world.quarantined[batch_id] = {"column": column, "defect_type": defect_type}
        self.cite(batch_id, column, defect_type)
        result = {"status": "quarantined", "batch_id": batch_id}
        if warning:
            result["warning"] = warning
        return result

    def submit_report(self, loaded, quarantined):
        report = {"loaded": sorted(loaded), "quarantined": sorted(quarantined)}
        if self.world.report is not None:
            self.ledger.append("submit_report", report, False, "already submitted")
            return {"error": "a report was already submitted; the first one stands"}
        self.ledger.append("submit_report", report, True)
        self.world.report = report
        return {"status": "received"}
