"""The seven tools, the only way an agent touches an episode: exact results, refusals, ledger.

`Episode.call(tool, args)` checks the arguments (a wrong type is refused, never coerced),
writes the ledger entry (refused calls included; a load's entry before its effect) and
returns the JSON value the agent sees: the result, or `{"error": ...}`.
"""
from __future__ import annotations

import json

from .actions import Action, ledger_repr
from .contract import COLUMNS, DEFECT_TYPES
from .sandbox import CAUGHT, bounded, normalise_query, too_long
from .world import PreparedCase, World

LOADED_WARNING = "already loaded - quarantine does not remove loaded rows"

# tool -> ordered (argument, kind); kind "str" or "strlist"
SIGNATURES: dict[str, tuple[tuple[str, str], ...]] = {
    "read_contract": (),
    "list_batches": (),
    "profile_batch": (("batch_id", "str"),),
    "run_sql": (("query", "str"),),
    "load_batch": (("batch_id", "str"),),
    "quarantine_batch": (("batch_id", "str"), ("column", "str"), ("defect_type", "str")),
    "submit_report": (("loaded", "strlist"), ("quarantined", "strlist")),
}
TOOL_NAMES = tuple(SIGNATURES)
DECISIONS = ("load_batch", "quarantine_batch")
TOOL_NAME_CHARS = 100


def tool_name(tool) -> str:
    """A tool name as the ledger keeps it: text, and bounded (the agent chose it)."""
    name = tool if isinstance(tool, str) else "?" if tool is None else ledger_repr(tool)
    return name if len(name) <= TOOL_NAME_CHARS else name[:TOOL_NAME_CHARS] + "...[truncated]"


ARG_CHARS = 200  # a batch id, column, defect type or listed id longer than this is refused
LIST_ITEMS = 1_000
# arguments with a limit of their own: run_sql bounds its query itself (None); a v2 question may be longer
ARG_LIMITS: dict[str, int | None] = {"query": None, "question": 1_000}


class _Shape:
    """What check_args needs of a signature table, computed once per table."""
    __slots__ = ("names", "plain")

    def __init__(self, signatures: dict):
        self.names = {tool: frozenset(name for name, _ in sig) for tool, sig in signatures.items()}
        # tools whose arguments are all strings of at most ARG_CHARS (the common case, decided quickly)
        self.plain = {tool for tool, sig in signatures.items()
                      if all(kind == "str" and name not in ARG_LIMITS for name, kind in sig)}


_SHAPES: dict[int, _Shape] = {}


def _shape(signatures: dict) -> _Shape:
    shape = _SHAPES.get(id(signatures))
    if shape is None:
        shape = _SHAPES[id(signatures)] = _Shape(signatures)
    return shape


def check_args(tool: str, args, signatures: dict = SIGNATURES) -> str | None:
    """The refusal text for malformed arguments, or None when they are well formed (`signatures`: the
    episode's tools, the classic seven by default)."""
    shape = _shape(signatures)
    if type(args) is dict and args.keys() == shape.names[tool] and all(
            type(args[name]) is str and (len(args[name]) <= ARG_CHARS or name == "query")
            for name, kind in signatures[tool] if kind == "str") and (tool in shape.plain or tool == "run_sql"):
        return None  # the common case, decided quickly
    if not isinstance(args, dict):
        return f"{tool}: arguments must be an object, not {type(args).__name__}"
    sig = signatures[tool]
    names = [name for name, _ in sig]
    extra = [k for k in args if k not in names]
    if extra:
        shown = repr(extra[0]) if isinstance(extra[0], str) and len(extra[0]) <= ARG_CHARS else ledger_repr(extra[0])
        return f"{tool}: unexpected argument {shown}; it takes {names or 'no arguments'}"
    for name, kind in sig:
        if name not in args:
            return f"{tool}: missing argument {name!r}"
        value = args[name]
        if kind == "str" and not isinstance(value, str):
            return f"{tool}: argument {name!r} must be a string, not {type(value).__name__}"
        limit = ARG_LIMITS.get(name, ARG_CHARS)
        if kind == "str" and limit is not None and len(value) > limit:  # run_sql bounds its query itself
            return f"{tool}: argument {name!r} is {len(value):,} characters long; the limit is {limit:,}"
        if kind == "strlist" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"{tool}: argument {name!r} must be a list of strings"
        if kind == "strlist" and (len(value) > LIST_ITEMS or any(len(v) > ARG_CHARS for v in value)):
            return f"{tool}: argument {name!r} may list at most {LIST_ITEMS} ids of at most {ARG_CHARS} characters"
    return None


class Episode:
    """One play of one case: the world, its ledger, and the seven tools over them."""

    def __init__(self, case_or_prepared, listener=None, deferred_ledger: bool = False):
        prepared = case_or_prepared if isinstance(case_or_prepared, PreparedCase) else PreparedCase(case_or_prepared)
        self.prepared = prepared
        self.world = World(prepared, listener, deferred_ledger)
        self.ledger = self.world.ledger

    # -- the one entry point --------------------------------------------------------------
    def call(self, tool, args=None):
        """Run one tool call; returns the JSON value the agent sees."""
        args = {} if args is None else args
        if not isinstance(tool, str) or tool not in SIGNATURES:
            name = tool_name(tool)
            self.ledger.append(name, {"sent": ledger_repr(args)}, False, "unknown tool")
            return {"error": f"unknown tool {name!r}; tools are {list(TOOL_NAMES)}"}
        problem = check_args(tool, args)
        if problem:
            self.ledger.append(tool, {"sent": ledger_repr(args)}, False, "bad arguments")
            return {"error": problem}
        return getattr(self, tool)(**args)

    def refuse(self, action: Action):
        """Answer a malformed action (see `actions.parse_action`) and log it like any refused call."""
        self.ledger.append(tool_name(action.tool), {"sent": ledger_repr(action.args)}, False, "malformed action")
        return {"error": action.problem}

    def close(self) -> None:
        self.world.close()

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
            result, tables = self.world.sandbox.run(query)
        except CAUGHT as exc:
            self.ledger.append("run_sql", {"query": query}, False, type(exc).__name__)
            return {"error": str(exc)}
        self.ledger.append("run_sql", {"query": query, "tables_read": tables}, True)
        return result

    def load_batch(self, batch_id):
        world = self.world
        if batch_id not in self.prepared.batches:
            self.ledger.append("load_batch", {"batch_id": batch_id}, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        if batch_id in world.quarantined:
            self.ledger.append("load_batch", {"batch_id": batch_id}, False, "quarantined")
            return {"error": f"{batch_id} is quarantined"}
        orphans = world.orphan_rows(batch_id)
        rows = len(self.prepared.load_rows[batch_id])
        self.ledger.append("load_batch", {"batch_id": batch_id, "rows": rows, "orphan_rows": orphans}, True)
        world.load(batch_id, orphans)
        return {"status": "loaded", "rows_loaded": rows, "errors": 0}

    def quarantine_batch(self, batch_id, column, defect_type):
        world = self.world
        args = {"batch_id": batch_id, "column": column, "defect_type": defect_type}
        if batch_id not in self.prepared.batches:
            self.ledger.append("quarantine_batch", args, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        if defect_type not in DEFECT_TYPES:
            self.ledger.append("quarantine_batch", args, False, "unknown defect type")
            return {"error": f"defect_type must be one of {list(DEFECT_TYPES)}"}
        columns = COLUMNS[self.prepared.batches[batch_id]["table"]]
        if column not in columns:
            self.ledger.append("quarantine_batch", args, False, "unknown column")
            return {"error": f"column must be one of {list(columns)}"}
        if batch_id in world.quarantined:
            self.ledger.append("quarantine_batch", args, False, "already quarantined")
            return {"error": f"{batch_id} is already quarantined; the first citation stands"}
        warning = LOADED_WARNING if world.loads.get(batch_id) else ""
        self.ledger.append("quarantine_batch", args, True, warning)
        world.quarantined[batch_id] = {"column": column, "defect_type": defect_type}
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
