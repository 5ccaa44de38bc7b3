"""The tools of a v2 episode: the classic seven, and three more the v2 contract needs.

The classic seven keep their names, arguments, results and refusal texts; in a v2 episode they
work on the v2 world (columns, defect types, the by-position loader) and `run_sql` records which
batches a read looked at (`looked_at`, see `suite_v2.sandbox`). The three new tools:

- `quarantine_rows(batch_id, keys, column, defect_type)`: hold rows of a batch back from its
  load, named by the key column (order_id, customer_id) and cited like a batch. Before the
  batch is loaded, and only keys that name rows: `load_batch` then loads the rest.
- `cite_defect(batch_id, column, defect_type)`: cite one more defect of a batch that is
  quarantined or holds quarantined rows (a batch can have several; each must be cited).
- `ask_owner(batch_id, column, question)`: ask the contract owner about a batch's column; the
  answer is the owner's rulings on the values the contract leaves open there (from the case),
  free when there are any, at the contract's cost per question otherwise.
"""
from __future__ import annotations

from ..actions import ledger_repr
from ..contract import COLUMNS_V2, DEFECT_TYPES_V2, KEY_COLUMNS
from ..sandbox import CAUGHT, bounded, normalise_query, too_long
from ..tools import LOADED_WARNING, SIGNATURES, Episode, check_args, tool_name
from .world import PreparedCaseV2, WorldV2, _quoted

SIGNATURES_V2: dict[str, tuple[tuple[str, str], ...]] = {
    **{tool: sig for tool, sig in SIGNATURES.items() if tool != "submit_report"},
    "quarantine_rows": (("batch_id", "str"), ("keys", "strlist"), ("column", "str"), ("defect_type", "str")),
    "cite_defect": (("batch_id", "str"), ("column", "str"), ("defect_type", "str")),
    "ask_owner": (("batch_id", "str"), ("column", "str"), ("question", "str")),
    "submit_report": SIGNATURES["submit_report"],
}
TOOL_NAMES_V2 = tuple(SIGNATURES_V2)
NO_RULING = "The contract owner has nothing to add about {column} in {batch}: the contract stands."


class EpisodeV2(Episode):
    """One play of one v2 case: the world, its ledger, and the ten tools over them."""

    signatures = SIGNATURES_V2

    def __init__(self, prepared: PreparedCaseV2, listener=None, deferred_ledger: bool = False):
        self.prepared = prepared
        self.world = WorldV2(prepared, listener, deferred_ledger)
        self.ledger = self.world.ledger

    def call(self, tool, args=None):
        """Run one tool call; returns the JSON value the agent sees."""
        args = {} if args is None else args
        if not isinstance(tool, str) or tool not in SIGNATURES_V2:
            name = tool_name(tool)
            self.ledger.append(name, {"sent": ledger_repr(args)}, False, "unknown tool")
            return {"error": f"unknown tool {name!r}; tools are {list(TOOL_NAMES_V2)}"}
        problem = check_args(tool, args, SIGNATURES_V2)
        if problem:
            self.ledger.append(tool, {"sent": ledger_repr(args)}, False, "bad arguments")
            return {"error": problem}
        return getattr(self, tool)(**args)

    # -- refusals shared by the decisions ------------------------------------------------------
    def _citation_problem(self, tool: str, args: dict, batch_id: str, column: str, defect_type: str):
        if batch_id not in self.prepared.batches:
            self.ledger.append(tool, args, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        if defect_type not in DEFECT_TYPES_V2:
            self.ledger.append(tool, args, False, "unknown defect type")
            return {"error": f"defect_type must be one of {list(DEFECT_TYPES_V2)}"}
        columns = COLUMNS_V2[self.prepared.batches[batch_id]["table"]]
        if column not in columns:
            self.ledger.append(tool, args, False, "unknown column")
            return {"error": f"column must be one of {list(columns)}"}
        return None

    def _cite(self, batch_id: str, column: str, defect_type: str) -> None:
        cited = self.world.citations.setdefault(batch_id, [])
        if (column, defect_type) not in cited:
            cited.append((column, defect_type))

    # -- the tools that differ in v2 -------------------------------------------------------------
    def profile_batch(self, batch_id):
        result = super().profile_batch(batch_id)
        if batch_id in self.prepared.batches:
            self.world.sandbox.mark_looked(self.prepared.staging[batch_id])
        return result

    def run_sql(self, query):
        refusal = too_long(query)
        if refusal:
            self.ledger.append("run_sql", {"query": bounded(query)}, False, "query too long")
            return {"error": refusal}
        query = normalise_query(query)
        try:
            result, tables, looked = self.world.sandbox.run(query)
        except CAUGHT as exc:
            self.ledger.append("run_sql", {"query": query}, False, type(exc).__name__)
            return {"error": str(exc)}
        self.ledger.append("run_sql", {"query": query, "tables_read": tables, "looked_at": looked}, True)
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
        rows = world.rows_to_load(batch_id)
        held = world.held_rows.get(batch_id, 0)
        self.ledger.append("load_batch", {"batch_id": batch_id, "rows": rows, "orphan_rows": orphans,
                                          "held_back": held}, True)
        if orphans:
            world.orphans_at_load[batch_id] = max(world.orphans_at_load.get(batch_id, 0), orphans)
        world.load(batch_id)
        result = {"status": "loaded", "rows_loaded": rows, "errors": 0}
        if held:
            result["rows_held_back"] = held
        return result

    def quarantine_batch(self, batch_id, column, defect_type):
        world = self.world
        args = {"batch_id": batch_id, "column": column, "defect_type": defect_type}
        problem = self._citation_problem("quarantine_batch", args, batch_id, column, defect_type)
        if problem:
            return problem
        if batch_id in world.quarantined:
            self.ledger.append("quarantine_batch", args, False, "already quarantined")
            return {"error": f"{batch_id} is already quarantined; the first citation stands"}
        warning = LOADED_WARNING if world.loads.get(batch_id) else ""
        self.ledger.append("quarantine_batch", args, True, warning)
        world.quarantined[batch_id] = {"column": column, "defect_type": defect_type}
        self._cite(batch_id, column, defect_type)
        result = {"status": "quarantined", "batch_id": batch_id}
        if warning:
            result["warning"] = warning
        return result

    def quarantine_rows(self, batch_id, keys, column, defect_type):
        world, prepared = self.world, self.prepared
        args = {"batch_id": batch_id, "keys": keys, "column": column, "defect_type": defect_type}
        problem = self._citation_problem("quarantine_rows", args, batch_id, column, defect_type)
        if problem:
            return problem
        table = prepared.batches[batch_id]["table"]
        key = KEY_COLUMNS[table]
        if batch_id in world.quarantined:
            self.ledger.append("quarantine_rows", args, False, "quarantined")
            return {"error": f"{batch_id} is quarantined"}
        if world.loads.get(batch_id):
            self.ledger.append("quarantine_rows", args, False, "already loaded")
            return {"error": f"{batch_id} is already loaded; rows cannot be held back from a load that happened"}
        if key not in prepared.headers[batch_id]:
            self.ledger.append("quarantine_rows", args, False, "no key column")
            return {"error": f"{batch_id}'s file has no column {key!r} to name its rows by"}
        if not keys:
            self.ledger.append("quarantine_rows", args, False, "no keys")
            return {"error": "keys must name at least one row"}
        held = world.held.setdefault(batch_id, set())
        new = sorted(set(keys) - held)
        found = dict(world.conn.execute(
            f"SELECT {_quoted(key)}, COUNT(*) FROM {prepared.staging[batch_id]} "
            f"WHERE {_quoted(key)} IN ({', '.join('?' * len(new))}) GROUP BY 1", new).fetchall()) if new else {}
        if not found and not (set(keys) & held):
            self.ledger.append("quarantine_rows", args, False, "unknown keys")
            return {"error": f"none of these keys names a row of {batch_id} (by {key})"}
        matched = sum(found.values())
        self.ledger.append("quarantine_rows", {**args, "rows_matched": matched}, True)
        held.update(found)
        world.held_rows[batch_id] = world.held_rows.get(batch_id, 0) + matched
        self._cite(batch_id, column, defect_type)
        return {"status": "quarantined", "batch_id": batch_id, "rows_quarantined": matched,
                "keys_not_found": len(new) - len(found)}

    def cite_defect(self, batch_id, column, defect_type):
        world = self.world
        args = {"batch_id": batch_id, "column": column, "defect_type": defect_type}
        problem = self._citation_problem("cite_defect", args, batch_id, column, defect_type)
        if problem:
            return problem
        if batch_id not in world.quarantined and not world.held.get(batch_id):
            self.ledger.append("cite_defect", args, False, "not quarantined")
            return {"error": f"{batch_id} is not quarantined and holds no quarantined rows; quarantine it "
                             f"(quarantine_batch) or its rows (quarantine_rows) first"}
        if (column, defect_type) in world.citations.get(batch_id, ()):
            self.ledger.append("cite_defect", args, False, "already cited")
            return {"error": f"{batch_id}: {column} / {defect_type} is already cited"}
        self.ledger.append("cite_defect", args, True)
        self._cite(batch_id, column, defect_type)
        return {"status": "cited", "batch_id": batch_id, "citations": len(world.citations[batch_id])}

    def ask_owner(self, batch_id, column, question):
        prepared = self.prepared
        args = {"batch_id": batch_id, "column": column, "question": question}
        if batch_id not in prepared.batches:
            self.ledger.append("ask_owner", args, False, "unknown batch")
            return {"error": f"no batch {batch_id!r}"}
        columns = list(dict.fromkeys([*COLUMNS_V2[prepared.batches[batch_id]["table"]], *prepared.headers[batch_id]]))
        if column not in columns:
            self.ledger.append("ask_owner", args, False, "unknown column")
            return {"error": f"column must be one of {columns}"}
        self.ledger.append("ask_owner", args, True)
        rulings = prepared.rulings.get((batch_id, column), [])
        cost = 0.0 if rulings else float(prepared.contract["ask_owner"]["cost_per_question"])
        if not rulings:
            return {"batch_id": batch_id, "column": column, "rulings": [], "cost": cost,
                    "answer": NO_RULING.format(column=column, batch=batch_id)}
        return {"batch_id": batch_id, "column": column, "cost": cost,
                "rulings": [{k: r[k] for k in ("value", "ruling", "defect_type") if k in r} for r in rulings],
                "answer": " ".join(r["answer"] for r in rulings)}
