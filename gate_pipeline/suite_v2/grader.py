"""The v2 rubric: the classic four terms, graded at the level v2 needs, and the cost of questions.

As in the classic grader, a grade is computed from the ledger's executed entries (in order) and
the mart of the warehouse, never from what the agent says; no report, no credit; a failed
episode scores 0. The terms and their weights are the classic ones (records.WEIGHTS):

- `disposition` (0.50): per batch, then the mean over batches. A batch the truth quarantines
  whole scores 1 when it was quarantined and never loaded. Any other batch scores on its rows:
  half for its bad rows (the share quarantined, by row or with the batch, and never loaded)
  and half for its clean rows (the share loaded exactly once, not held back, and not loaded
  before their customer); a batch with no bad rows scores on its clean rows alone. A batch
  loaded twice loads no clean row right.
- `report` (0.20): the report's lists are exactly the batches loaded and those quarantined.
- `evidence` (0.15): per defect. For each defective batch whose bad rows were all kept out,
  (defects cited - citations that match no defect) / defects, at least 0; summed over
  defective batches, minus one per clean batch cited, over the number of defective batches,
  at least 0. Without defective batches: 1 when nothing was cited, else 0.
- `inspected` (0.15): of the batches acted on (the first load, quarantine or row quarantine of
  each), the share looked at before that action: profiled, or read by a query whose result or
  work depended on the batch's rows (`looked_at`, see `suite_v2.sandbox`).

reward = 0.50 disposition + 0.20 report + 0.15 evidence + 0.15 inspected - questions x the
contract's cost per question, for every question about a column whose values the contract does
not leave open (the case's owner has no ruling on it), rounded to six decimals, at least 0.
"""
from __future__ import annotations

from fractions import Fraction

from ..ledger import chain_intact
from ..records import TERMS, WEIGHTS, Grade
from ..world import staging_table

_STR, _LIST = "str", "list"
# action -> the arguments an executed entry must carry, and their kinds
_NEEDS = {"load_batch": {"batch_id": _STR}, "quarantine_batch": {"batch_id": _STR, "column": _STR, "defect_type": _STR},
          "quarantine_rows": {"batch_id": _STR, "column": _STR, "defect_type": _STR, "keys": _LIST},
          "cite_defect": {"batch_id": _STR, "column": _STR, "defect_type": _STR},
          "profile_batch": {"batch_id": _STR}, "run_sql": {}, "ask_owner": {"batch_id": _STR, "column": _STR},
          "submit_report": {}}
ACTIONS = ("load_batch", "quarantine_batch", "quarantine_rows")


def _well_formed(entry) -> tuple[str, dict] | None:
    """(action, args) of an executed entry the grader can read, else None (a stored ledger can be edited
    by hand; its chain is then broken and `ledger_intact` says so, but grading goes on)."""
    if type(entry) is not dict or entry.get("executed") is not True:
        return None
    action, args = entry.get("action"), entry.get("args")
    needs = _NEEDS.get(action)
    if needs is None or type(args) is not dict:
        return None
    for key, kind in needs.items():
        value = args.get(key)
        if kind == _STR and type(value) is not str:
            return None
        if kind == _LIST and not (type(value) is list and all(type(v) is str for v in value)):
            return None
    return action, args


def _int(value) -> int:
    return value if type(value) is int and value >= 0 else 0


class EpisodeState:
    """What an episode did, folded from its executed ledger entries in order (`apply` one at a time)."""

    def __init__(self, case: dict):
        self.by_table = {staging_table(b["batch_id"]): b["batch_id"] for b in case["batches"]}
        self.known = {b["batch_id"] for b in case["batches"]}
        self.loads: dict[str, int] = {}
        self.rows_loaded: dict[str, int] = {}
        self.quarantined: dict[str, dict] = {}
        self.citations: dict[str, list[tuple[str, str]]] = {}
        self.held: dict[str, set[str]] = {}
        self.held_rows: dict[str, int] = {}
        self.first_load: dict[str, tuple[frozenset, int, int]] = {}  # held keys, held rows, orphan rows
        self.looked: set[str] = set()
        self.acted: dict[str, bool] = {}
        self.questions: list[tuple[str, str]] = []
        self.report: dict | None = None

    def _cite(self, bid: str, column: str, defect_type: str) -> None:
        cited = self.citations.setdefault(bid, [])
        if (column, defect_type) not in cited:
            cited.append((column, defect_type))

    def apply(self, entry) -> None:
        parsed = _well_formed(entry)
        if parsed is None:
            return
        action, args = parsed
        bid = args.get("batch_id")
        if action in ACTIONS and bid not in self.acted:
            self.acted[bid] = bid in self.looked
        if action == "profile_batch":
            self.looked.add(bid)
        elif action == "run_sql":
            for table in args.get("looked_at") if isinstance(args.get("looked_at"), list) else ():
                if isinstance(table, str) and table in self.by_table:
                    self.looked.add(self.by_table[table])
        elif action == "load_batch":
            self.loads[bid] = self.loads.get(bid, 0) + 1
            self.rows_loaded[bid] = self.rows_loaded.get(bid, 0) + _int(args.get("rows"))
            if bid not in self.first_load:
                self.first_load[bid] = (frozenset(self.held.get(bid, ())), self.held_rows.get(bid, 0),
                                        _int(args.get("orphan_rows")))
        elif action == "quarantine_batch":
            self.quarantined.setdefault(bid, {"column": args["column"], "defect_type": args["defect_type"]})
            self._cite(bid, args["column"], args["defect_type"])
        elif action == "quarantine_rows":
            if bid not in self.loads:
                self.held.setdefault(bid, set()).update(args["keys"])
                self.held_rows[bid] = self.held_rows.get(bid, 0) + _int(args.get("rows_matched"))
            self._cite(bid, args["column"], args["defect_type"])
        elif action == "cite_defect":
            self._cite(bid, args["column"], args["defect_type"])
        elif action == "ask_owner":
            self.questions.append((bid, args["column"]))
        elif action == "submit_report" and self.report is None:
            lists = [args.get("loaded"), args.get("quarantined")]
            if all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
                self.report = {"loaded": lists[0], "quarantined": lists[1]}


def fold(case: dict, entries) -> EpisodeState:
    state = EpisodeState(case)
    for entry in entries:
        state.apply(entry)
    return state


def _bad_keys(truth: dict) -> set[str]:
    return {k for d in truth["defects"] for k in d.get("keys", ())}


def _orphan_keys(truth: dict) -> set[str]:
    return {k for d in truth["defects"] if d["type"] == "orphan_reference" for k in d.get("keys", ())}


def batch_outcome(batch: dict, state: EpisodeState) -> dict:
    """One batch's row-level outcome: its disposition score, bad rows kept out and loaded, clean rows
    loaded right and lost."""
    bid, truth, n = batch["batch_id"], batch["truth"], batch["row_count"]
    loads = state.loads.get(bid, 0)
    quarantined = bid in state.quarantined
    if truth["disposition"] == "quarantine":  # every row is tainted by the batch's defect
        loaded = state.rows_loaded.get(bid, 0)
        return {"score": 1.0 if quarantined and loads == 0 else 0.0, "bad": n, "kept_out": n if quarantined and loads == 0 else 0,
                "bad_loaded": loaded, "clean": 0, "clean_right": 0, "clean_lost": 0}
    bad = _bad_keys(truth)
    nb, nc = len(bad), n - len(bad)
    if loads == 0:
        kept_out = nb if quarantined else len(bad & state.held.get(bid, set()))
        clean_right, clean_lost, bad_loaded = 0, nc, 0
    else:
        held, held_rows, orphans = state.first_load[bid]
        bad_in = bad - held
        kept_out = nb - len(bad_in)
        bad_loaded = len(bad_in) * loads
        clean_held = max(0, held_rows - len(bad & held))
        clean_lost = min(nc, clean_held)
        clean_orphans = max(0, orphans - len(bad_in & _orphan_keys(truth)))
        clean_right = max(0, nc - clean_held - clean_orphans) if loads == 1 else 0
    if nb and nc:
        score = 0.5 * kept_out / nb + 0.5 * clean_right / nc
    elif nb:
        score = kept_out / nb
    else:
        score = clean_right / nc if nc else (1.0 if loads == 1 else 0.0)
    return {"score": score, "bad": nb, "kept_out": kept_out, "bad_loaded": bad_loaded, "clean": nc,
            "clean_right": clean_right, "clean_lost": clean_lost}


def _matches(citation: tuple[str, str], defect: dict) -> bool:
    if citation == (defect["column"], defect["type"]):
        return True
    return any(citation == (a["column"], a["type"]) for a in defect.get("accepted", ()))


def evidence(case: dict, state: EpisodeState, outcomes: dict) -> float:
    batches = case["batches"]
    defective = [b for b in batches if b["truth"]["defective"]]
    if not defective:
        return 0.0 if any(state.citations.get(b["batch_id"]) for b in batches) else 1.0
    total = Fraction(0)
    for b in defective:
        cites = state.citations.get(b["batch_id"], [])
        outcome = outcomes[b["batch_id"]]
        if not cites or outcome["kept_out"] < outcome["bad"]:
            continue
        defects = b["truth"]["defects"]
        hits = sum(1 for d in defects if any(_matches(c, d) for c in cites))
        wrong = sum(1 for c in cites if not any(_matches(c, d) for d in defects))
        total += max(Fraction(0), Fraction(hits - wrong, len(defects)))
    wrong_clean = sum(1 for b in batches if not b["truth"]["defective"] and state.citations.get(b["batch_id"]))
    return float(max(Fraction(0), (total - wrong_clean) / len(defective)))


def question_cost(case: dict, state: EpisodeState) -> float:
    """The cost of the questions whose answer the case's owner has no ruling for."""
    ruled = {(r["batch_id"], r["column"]) for r in case["owner"]}
    paid = sum(1 for q in state.questions if q not in ruled)
    return round(paid * float(case["contract"]["ask_owner"]["cost_per_question"]), 6)


def terms_of(case: dict, state: EpisodeState) -> tuple[dict, dict]:
    """({disposition, evidence, inspected}, outcome per batch) of the state as it stands."""
    outcomes = {b["batch_id"]: batch_outcome(b, state) for b in case["batches"]}
    disposition = sum(o["score"] for o in outcomes.values()) / len(outcomes)
    inspected = sum(state.acted.values()) / len(state.acted) if state.acted else 0.0
    return {"disposition": disposition, "evidence": evidence(case, state, outcomes), "inspected": inspected}, outcomes


def report_term(state: EpisodeState) -> float:
    if state.report is None:
        return 0.0
    loaded = sorted(b for b, n in state.loads.items() if n)
    ok = state.report["loaded"] == loaded and state.report["quarantined"] == sorted(state.quarantined)
    return 1.0 if ok else 0.0


def grade_record(case: dict, entries: list[dict], mart: float, correct_mart: float, failure: str = "",
                 intact: bool | None = None) -> Grade:
    """The v2 grade from a case's truth labels, a ledger and the mart (see the module's docstring)."""
    state = fold(case, entries)
    terms, outcomes = terms_of(case, state)
    cost = question_cost(case, state)
    finished = state.report is not None
    if finished and not failure:
        terms["report"] = report_term(state)
        values = tuple(terms[t] for t in TERMS)
        reward = max(0.0, round(sum(WEIGHTS[k] * v for k, v in zip(TERMS, values)) - cost, 6))
    else:
        values, reward = (0.0, 0.0, 0.0, 0.0), 0.0
    truth = {b["batch_id"]: b["truth"] for b in case["batches"]}
    return Grade(case["case_id"], case["family"], *values, reward,
                 sum(1 for bid, o in outcomes.items() if truth[bid]["defective"] and o["bad_loaded"]),
                 sum(1 for bid in state.quarantined if bid in truth and not truth[bid]["defective"]),
                 round(abs(mart - correct_mart), 2), chain_intact(entries) if intact is None else intact,
                 finished, mart, correct_mart, bool(failure), failure, suite="v2", question_cost=cost,
                 bad_rows_loaded=sum(o["bad_loaded"] for o in outcomes.values()),
                 clean_rows_lost=sum(o["clean_lost"] for o in outcomes.values()))
