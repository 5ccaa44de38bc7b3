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
- `evidence` (0.15): per defect. For each defective batch whose bad rows were all kept out (a batch
  the contract holds back by rows, by rows: quarantined whole, or with more than the contract's
  `row_quarantine.max_rows` rows held back, it earns none),
  (defects cited - citations that match no defect) / defects, at least 0, where each citation
  counts for one defect at most (a largest matching of citations to the defects they match, so
  a citation two defects accept is credited once); summed over defective batches, minus one per
  clean batch cited, over the number of defective batches, at least 0. Without defective
  batches: 1 when nothing was cited, else 0.
- `inspected` (0.15): of the batches acted on (the first load, quarantine or row quarantine of
  each), the share looked at before that action: profiled, or read by a query whose result or
  work depended on the batch's rows (`looked_at`, see `suite_v2.sandbox`).

reward = 0.50 disposition + 0.20 report + 0.15 evidence + 0.15 inspected - questions x the
contract's cost per question, for every question about a column the contract's `ask_owner.columns`
does not name (as the contract words it), rounded to six decimals, at least 0.
"""
from __future__ import annotations

import math
from fractions import Fraction

from ...kernel.cases import Case
from ...kernel.grading import LIST, STR, Judgement, LedgerFold, Rubric
from .contract import question_cost as column_cost


def _int(value) -> int:
    return value if type(value) is int and value >= 0 else 0


class EpisodeState(LedgerFold):
    """The kernel's fold, and what v2 adds: rows loaded, rows held back before the first load, every
    citation of a batch, the questions asked; a read counts by what it looked at (`looked_at`)."""

    needs = {**LedgerFold.needs,
             "quarantine_rows": {"batch_id": STR, "column": STR, "defect_type": STR, "keys": LIST},
             "cite_defect": {"batch_id": STR, "column": STR, "defect_type": STR},
             "ask_owner": {"batch_id": STR, "column": STR}}
    decisions = ("load_batch", "quarantine_batch", "quarantine_rows")
    looks = "looked_at"

    def __init__(self, case: Case):
        super().__init__(case)
        self.rows_loaded: dict[str, int] = {}
        self.citations: dict[str, list[tuple[str, str]]] = {}
        self.held: dict[str, set[str]] = {}
        self.held_rows: dict[str, int] = {}
        self.first_load: dict[str, tuple[frozenset, int, int]] = {}  # held keys, held rows, orphan rows
        self.questions: list[tuple[str, str]] = []

    def _cite(self, bid: str, column: str, defect_type: str) -> None:
        cited = self.citations.setdefault(bid, [])
        if (column, defect_type) not in cited:
            cited.append((column, defect_type))

    def on_load_batch(self, args: dict) -> None:
        super().on_load_batch(args)
        bid = args["batch_id"]
        self.rows_loaded[bid] = self.rows_loaded.get(bid, 0) + _int(args.get("rows"))
        if bid not in self.first_load:
            self.first_load[bid] = (frozenset(self.held.get(bid, ())), self.held_rows.get(bid, 0),
                                    _int(args.get("orphan_rows")))

    def on_quarantine_batch(self, args: dict) -> None:
        super().on_quarantine_batch(args)
        self._cite(args["batch_id"], args["column"], args["defect_type"])

    def on_quarantine_rows(self, args: dict) -> None:
        bid = args["batch_id"]
        if bid not in self.loads:
            self.held.setdefault(bid, set()).update(args["keys"])
            self.held_rows[bid] = self.held_rows.get(bid, 0) + _int(args.get("rows_matched"))
        self._cite(bid, args["column"], args["defect_type"])

    def on_cite_defect(self, args: dict) -> None:
        self._cite(args["batch_id"], args["column"], args["defect_type"])

    def on_ask_owner(self, args: dict) -> None:
        self.questions.append((args["batch_id"], args["column"]))


def fold(case: Case, entries) -> EpisodeState:
    state = EpisodeState(case)
    state.fold(entries)
    return state


def _bad_keys(truth) -> set[str]:
    return {k for d in truth["defects"] for k in d.get("keys", ())}


def _orphan_keys(truth) -> set[str]:
    return {k for d in truth["defects"] if d["type"] == "orphan_reference" for k in d.get("keys", ())}


def batch_outcome(batch, state: EpisodeState) -> dict:
    """One batch's row-level outcome: its disposition score, bad rows kept out and loaded, clean rows
    loaded right and lost."""
    bid, truth, n = batch.batch_id, batch.truth, batch.data["row_count"]
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


def credited(cites: list[tuple[str, str]], defects: list[dict]) -> int:
    """How many defects the citations cover when each citation counts for one defect at most: the size of
    a largest matching between citations and the defects they match (augmenting paths; a batch has a few)."""
    owner: dict[int, int] = {}  # defect -> the citation credited for it

    def place(c: int, seen: set[int]) -> bool:
        for d, found in enumerate(defects):
            if d in seen or not _matches(cites[c], found):
                continue
            seen.add(d)
            if d not in owner or place(owner[d], seen):
                owner[d] = c
                return True
        return False
    return sum(1 for c in range(len(cites)) if place(c, set()))


def evidence(case: Case, state: EpisodeState, outcomes: dict) -> float:
    batches = case.batches
    defective = [b for b in batches if b.defective]
    if not defective:
        return 0.0 if any(state.citations.get(b.batch_id) for b in batches) else 1.0
    total = Fraction(0)
    max_rows = _int(dict(case.contract).get("row_quarantine", {}).get("max_rows"))
    for b in defective:
        cites = state.citations.get(b.batch_id, [])
        outcome = outcomes[b.batch_id]
        if not cites or outcome["kept_out"] < outcome["bad"]:
            continue
        if b.truth["disposition"] == "rows" and (b.batch_id in state.quarantined
                                                 or len(state.held.get(b.batch_id, ())) > max_rows):
            continue  # the contract holds back such a batch's bad rows, at most max_rows, and loads the rest:
            # a whole quarantine, or more rows held than the contract holds back, is no finding
        defects = b.truth["defects"]
        hits = credited(cites, defects)
        wrong = sum(1 for c in cites if not any(_matches(c, d) for d in defects))
        total += max(Fraction(0), Fraction(hits - wrong, len(defects)))
    wrong_clean = sum(1 for b in batches if not b.defective and state.citations.get(b.batch_id))
    return float(max(Fraction(0), (total - wrong_clean) / len(defective)))


def question_cost(case: Case, state: EpisodeState) -> float:
    """The cost of the questions, as the contract words it: nothing for a column `ask_owner.columns`
    names, `cost_per_question` for any other (`contract.question_cost`)."""
    contract = dict(case.contract)
    return round(math.fsum(column_cost(contract, column) for _, column in state.questions), 6)


def outcomes_of(case: Case, state: EpisodeState) -> dict[str, dict]:
    return {b.batch_id: batch_outcome(b, state) for b in case.batches}


class V2Rubric(Rubric):
    fold_class = EpisodeState

    def judge(self, case: Case, state: EpisodeState) -> Judgement:  # type: ignore[override]
        outcomes = outcomes_of(case, state)
        truth = {b.batch_id: b.truth for b in case.batches}
        cost = question_cost(case, state)
        return Judgement(
            disposition=sum(o["score"] for o in outcomes.values()) / len(outcomes),
            evidence=evidence(case, state, outcomes),
            inspected=state.inspected,
            bad_batches_loaded=sum(1 for bid, o in outcomes.items() if truth[bid]["defective"] and o["bad_loaded"]),
            clean_batches_refused=sum(1 for bid in state.quarantined if bid in truth and not truth[bid]["defective"]),
            cost=cost,
            metrics={"question_cost": cost, "bad_rows_loaded": sum(o["bad_loaded"] for o in outcomes.values()),
                     "clean_rows_lost": sum(o["clean_lost"] for o in outcomes.values())})


RUBRIC = V2Rubric()
