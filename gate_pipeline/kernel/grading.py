"""The grader's kernel: one fold of the ledger, the rubric's frame, and every grade computed here.

A grade is computed from what really happened: the ledger's executed entries, folded in order
(`LedgerFold`: loads, quarantines, looks, the first action on each batch, the report), and the
revenue mart of the episode's warehouse. Nothing the agent says outside the report is read, and
the report is only compared with what happened. No report, no credit; an episode that failed
(its agent raised, its run died, its model server never answered) scores 0 on every term, with
the reason kept.

A suite's `Rubric` says how the state it folds scores: `judge` gives disposition, evidence and
inspected, the batch counts, the cost of what the agent bought and the suite's own metrics; the
report term and the reward are the same for every suite:

    reward = max(0, 0.50 disposition + 0.20 report + 0.15 evidence + 0.15 inspected - cost), to 6 decimals

This is the only place a grade is computed: a live episode (`grade`), a stored one
(`grade_stored`), a replay, the potential reward's shaping (`Rubric.judge` on the state as it
stands) all come here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Mapping

from .cases import Case, staging_table
from .ledger import chain_intact
from .records import TERMS, WEIGHTS, Grade, StoredEpisode
from .suite import Suite, suites

STR, LIST = "str", "list"


class LedgerFold:
    """What an episode did, folded from its executed ledger entries in order (`apply` one at a time).

    A suite's subclass adds actions (`needs`: action -> the arguments an executed entry must carry,
    and their kinds; one `on_<action>` method each), the actions that count as acting on a batch
    (`decisions`), and which field of a `run_sql` entry lists the staging tables a read counts for
    (`looks`)."""

    needs: Mapping[str, Mapping[str, str]] = {
        "load_batch": {"batch_id": STR},
        "quarantine_batch": {"batch_id": STR, "column": STR, "defect_type": STR},
        "profile_batch": {"batch_id": STR}, "run_sql": {}, "submit_report": {}}
    decisions: tuple[str, ...] = ("load_batch", "quarantine_batch")
    looks = "tables_read"

    def __init__(self, case: Case):
        self.case = case
        self.by_table = {staging_table(b.batch_id): b.batch_id for b in case.batches}
        self.loads: dict[str, int] = {}
        self.quarantined: dict[str, dict] = {}  # batch -> its first citation
        self.orphans_at_load: dict[str, int] = {}
        self.looked: set[str] = set()
        self.acted: dict[str, bool] = {}  # batch -> looked at before the first action on it
        self.report: dict | None = None

    def well_formed(self, entry) -> tuple[str, dict] | None:
        """(action, args) of an executed entry the grader can read, else None (a stored ledger can be
        edited by hand; its chain is then broken and `ledger_intact` says so, but grading goes on)."""
        if type(entry) is not dict or entry.get("executed") is not True:
            return None
        action, args = entry.get("action"), entry.get("args")
        needs = self.needs.get(action) if isinstance(action, str) else None
        if needs is None or not isinstance(action, str) or type(args) is not dict:
            return None
        for key, kind in needs.items():
            value = args.get(key)
            if kind == STR and type(value) is not str:
                return None
            if kind == LIST and not (type(value) is list and all(type(v) is str for v in value)):
                return None
        return action, args

    def apply(self, entry) -> None:
        parsed = self.well_formed(entry)
        if parsed is None:
            return
        action, args = parsed
        if action in self.decisions:
            bid = args["batch_id"]
            if bid not in self.acted:
                self.acted[bid] = bid in self.looked
        getattr(self, f"on_{action}")(args)

    def fold(self, entries: Iterable) -> "LedgerFold":
        for entry in entries:
            self.apply(entry)
        return self

    # -- the actions every suite has ------------------------------------------------------------
    def on_profile_batch(self, args: dict) -> None:
        self.looked.add(args["batch_id"])

    def on_run_sql(self, args: dict) -> None:
        tables = args.get(self.looks)
        for table in tables if isinstance(tables, list) else ():
            if isinstance(table, str) and table in self.by_table:
                self.looked.add(self.by_table[table])

    def on_load_batch(self, args: dict) -> None:
        bid = args["batch_id"]
        self.loads[bid] = self.loads.get(bid, 0) + 1
        n = args.get("orphan_rows")
        if isinstance(n, int) and n > 0:
            self.orphans_at_load[bid] = max(self.orphans_at_load.get(bid, 0), n)

    def on_quarantine_batch(self, args: dict) -> None:
        self.quarantined.setdefault(args["batch_id"], {"column": args["column"], "defect_type": args["defect_type"]})

    def on_submit_report(self, args: dict) -> None:
        if self.report is None:
            lists = [args.get("loaded"), args.get("quarantined")]
            if all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
                self.report = {"loaded": lists[0], "quarantined": lists[1]}

    @property
    def inspected(self) -> float:
        """Of the batches acted on, the share looked at before the first action on them."""
        return sum(self.acted.values()) / len(self.acted) if self.acted else 0.0


@dataclass
class Judgement:
    """A rubric's verdict on a folded state: three of the four terms, the batch counts, what the agent's
    purchases cost (subtracted from the reward), and the suite's own metrics."""
    disposition: float
    evidence: float
    inspected: float
    bad_batches_loaded: int
    clean_batches_refused: int
    cost: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


class Rubric:
    """How a suite scores what an episode did; subclasses set `fold_class` and implement `judge`."""

    fold_class: type[LedgerFold] = LedgerFold

    def fold(self, case: Case, entries: Iterable = ()) -> LedgerFold:
        return self.fold_class(case).fold(entries)

    def judge(self, case: Case, state: LedgerFold) -> Judgement:
        raise NotImplementedError

    def report_term(self, state: LedgerFold) -> float:
        """1 when the report's lists are exactly the batches loaded and those quarantined, else 0."""
        if state.report is None:
            return 0.0
        loaded = sorted(b for b, n in state.loads.items() if n)
        ok = state.report["loaded"] == loaded and state.report["quarantined"] == sorted(state.quarantined)
        return 1.0 if ok else 0.0

    def potential(self, case: Case, state: LedgerFold) -> float:
        """Phi of the potential reward: disposition, evidence and inspected as they stand, weighted as in
        the rubric (0 once a report is in: the episode is over)."""
        if state.report is not None:
            return 0.0
        j = self.judge(case, state)
        return WEIGHTS["disposition"] * j.disposition + WEIGHTS["evidence"] * j.evidence \
            + WEIGHTS["inspected"] * j.inspected

    def grade(self, case: Case, entries: list[dict], mart: float, correct_mart: float, failure: str = "",
              intact: bool | None = None) -> Grade:
        """The grade from a case's truth labels, a ledger and the mart: all any episode needs.

        `failure`, when given, is why the episode failed: every term and the reward are then 0 (the
        metrics are still computed). `intact` may be passed when the caller has checked the chain."""
        state = self.fold(case, entries)
        j = self.judge(case, state)
        finished = state.report is not None
        if finished and not failure:
            values = (j.disposition, self.report_term(state), j.evidence, j.inspected)
            reward = max(0.0, round(sum(WEIGHTS[k] * v for k, v in zip(TERMS, values)) - j.cost, 6))
        else:
            values, reward = (0.0, 0.0, 0.0, 0.0), 0.0
        return Grade(case_id=case.case_id, family=case.family, disposition=values[0], report=values[1],
                     evidence=values[2], inspected=values[3], reward=reward,
                     bad_batches_loaded=j.bad_batches_loaded, clean_batches_refused=j.clean_batches_refused,
                     revenue_error_usd=round(abs(mart - correct_mart), 2),
                     ledger_intact=chain_intact(entries) if intact is None else intact, finished=finished,
                     revenue=mart, correct_revenue=correct_mart, failed=bool(failure), reason=failure,
                     suite=case.suite, metrics=j.metrics)


def grade(episode, failure: str = "") -> Grade:
    """The grade of a live episode, from its ledger and its warehouse.

    A deferred ledger's chain is computed from its entries when they are first read (see
    `records.EpisodeResult.ledger`): nothing but the engine ever held them, so it is intact by
    construction, and the grade, which reads what the entries say, not their hashes, does not wait for it."""
    prepared, ledger = episode.prepared, episode.ledger
    if ledger.deferred:
        entries, intact = ledger.entries, True
    else:
        entries, intact = ledger.seal(), None
    return prepared.suite.rubric.grade(prepared.case, entries, episode.world.revenue(), prepared.correct_mart,
                                       failure, intact)


_correct: dict[str, float] = {}


def correct_mart(case: Case, case_json: str | None = None) -> float:
    """The mart a correct run of `case` gives (cached by the case's content, `case_json` when the caller has
    it: ids may repeat)."""
    key = case_json or json.dumps(case.data, sort_keys=True)
    if key not in _correct:
        if len(_correct) > 4096:
            _correct.clear()
        prepared = case_suite(case).prepared_case(case)
        try:
            _correct[key] = prepared.correct_mart
        finally:
            prepared.close()
    return _correct[key]


def case_suite(case: Case) -> Suite:
    return suites.get(case.suite)


def grade_stored(stored: StoredEpisode) -> Grade:
    """Grade an episode the run store holds, from its stored ledger and warehouse, as any other.

    A stored episode that ended with an error, or that does not pass the store's checks (a broken or
    cut ledger, an altered case or warehouse, a record whose seal does not match), is a failed episode:
    it grades 0 with the reasons."""
    reasons = "; ".join(r for r in (stored.error, *stored.problems) if r)
    if stored.case is None:  # nothing to grade against: 0, with the reasons
        return zero_grade(stored.case_id, "?", reasons or "the stored case cannot be read")
    mart = stored.mart if stored.mart is not None else 0.0
    case = stored.case
    try:
        return case_suite(case).rubric.grade(case, stored.entries, mart, correct_mart(case, stored.case_json), reasons)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a stored case the grader cannot read
        return zero_grade(stored.case_id, case.family, f"{reasons + '; ' if reasons else ''}cannot be graded ({exc})")


def zero_grade(case_id: str, family: str, reason: str) -> Grade:
    """The grade of an episode that cannot be graded at all: 0 everywhere, failed, with the reason."""
    return Grade(case_id=case_id, family=family, disposition=0.0, report=0.0, evidence=0.0, inspected=0.0,
                 reward=0.0, bad_batches_loaded=0, clean_batches_refused=0, revenue_error_usd=0.0,
                 ledger_intact=False, finished=False, revenue=0.0, correct_revenue=0.0, failed=True, reason=reason)


def reward_of(terms: Mapping[str, float]) -> float:
    return round(sum(WEIGHTS[k] * terms[k] for k in TERMS), 6)


def exact_mean(values) -> Fraction:
    """Means computed exactly (from each value's %.9f form), so tables never drift by a digit: each value in
    billionths, a whole number (its %.9f text without the point), summed, over 10**9 times the count. The
    same Fraction as summing Fraction(%.9f text) of each, without a Fraction per value (a night's tables
    and page take thousands of means)."""
    values = list(values)
    if not values:
        return Fraction(0)
    return Fraction(sum(int(("%.9f" % v).replace(".", "", 1)) for v in values), 10 ** 9 * len(values))
