"""The grader: four scored terms, the reward and two metrics, all from what really happened.

It reads the episode's ledger (loads, quarantines, the report, in the order they were
executed) and the revenue mart of its warehouse; nothing the agent says outside the report is
read, and the report is only compared with what happened. No report, no credit; an episode
that failed (its agent raised, its run died, its model server never answered) scores 0 on
every term, with the reason kept. This is the only place a grade is computed: a live episode
(`grade`), a stored one (`grade_stored`) and a replay all come here.
"""
from __future__ import annotations

import json
from fractions import Fraction

from .ledger import chain_intact
from .records import GRADE_KEYS, TERMS, WEIGHTS, Grade, StoredEpisode  # noqa: F401  (re-exported)
from .world import staging_table


def disposition(truth: dict, loads: dict, quarantined: dict, orphans_at_load: dict) -> float:
    right = 0
    for bid, t in truth.items():
        if t["defective"]:
            right += loads.get(bid, 0) == 0 and bid in quarantined
        else:
            right += loads.get(bid, 0) == 1 and not orphans_at_load.get(bid)
    return right / len(truth)


def report_term(report: dict | None, loads: dict, quarantined: dict) -> float:
    if report is None:
        return 0.0
    ok = report["loaded"] == sorted(loads) and report["quarantined"] == sorted(quarantined)
    return 1.0 if ok else 0.0


def evidence(truth: dict, loads: dict, quarantined: dict) -> float:
    bad = [bid for bid, t in truth.items() if t["defective"]]
    if not bad:
        return 0.0 if quarantined else 1.0
    hits = 0
    for bid in bad:
        cite = quarantined.get(bid)
        if cite is None or loads.get(bid):
            continue
        accepted = truth[bid].get("accepted") or truth[bid]["defects"]
        hits += any(cite["column"] == a["column"] and cite["defect_type"] == a["type"] for a in accepted)
    wrong = sum(1 for bid in quarantined if bid in truth and not truth[bid]["defective"])
    return max(0.0, (hits - wrong) / len(bad))


_NEEDS = {"load_batch": ("batch_id",), "quarantine_batch": ("batch_id", "column", "defect_type"),
          "profile_batch": ("batch_id",), "run_sql": (), "submit_report": ()}


def executed(entries: list[dict]) -> list[tuple[str, dict]]:
    """(action, args) of each executed entry, skipping any malformed one (a stored ledger can be
    edited by hand; its chain is then broken and `ledger_intact` says so, but grading goes on)."""
    out = []
    for e in entries:
        if type(e) is not dict or e.get("executed") is not True:
            continue
        action, args = e.get("action"), e.get("args")
        needs = _NEEDS.get(action)
        if needs is None or type(args) is not dict:
            continue
        for key in needs:
            if type(args.get(key)) is not str:
                break
        else:
            out.append((action, args))
    return out


def inspected(entries: list[dict], staging: dict) -> float:
    """Share of acted-on batches that were profiled or queried before the first action on them."""
    return _inspected(executed(entries), staging)


def _inspected(acts: list[tuple[str, dict]], staging: dict) -> float:
    looked: set[str] = set()
    acted: dict[str, bool] = {}
    by_table = {table: bid for bid, table in staging.items()}
    for action, args in acts:
        if action == "profile_batch":
            looked.add(args["batch_id"])
        elif action == "run_sql":
            tables = args.get("tables_read")
            for table in tables if isinstance(tables, list) else ():
                if isinstance(table, str) and table in by_table:
                    looked.add(by_table[table])
        elif action in ("load_batch", "quarantine_batch"):
            bid = args["batch_id"]
            if bid not in acted:
                acted[bid] = bid in looked
    return sum(acted.values()) / len(acted) if acted else 0.0


def reward_of(terms: dict) -> float:
    return round(sum(WEIGHTS[k] * terms[k] for k in TERMS), 6)


def _state(acts: list[tuple[str, dict]]) -> dict:
    """Loads, first citations, orphans at load and the report, as the executed entries record them."""
    loads: dict[str, int] = {}
    quarantined: dict[str, dict] = {}
    orphans: dict[str, int] = {}
    report = None
    for action, args in acts:
        if action == "load_batch":
            bid = args["batch_id"]
            loads[bid] = loads.get(bid, 0) + 1
            n = args.get("orphan_rows")
            if isinstance(n, int) and n > 0:
                orphans[bid] = max(orphans.get(bid, 0), n)
        elif action == "quarantine_batch":
            quarantined.setdefault(args["batch_id"], {"column": args["column"], "defect_type": args["defect_type"]})
        elif action == "submit_report" and report is None:
            lists = [args.get("loaded"), args.get("quarantined")]
            if all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
                report = {"loaded": lists[0], "quarantined": lists[1]}
    return {"loads": loads, "quarantined": quarantined, "orphans_at_load": orphans, "report": report}


def grade_record(case: dict, entries: list[dict], mart: float, correct_mart: float, failure: str = "",
                 intact: bool | None = None) -> Grade:
    """The grade from a case's truth labels, a ledger and the mart: all any episode needs.

    `failure`, when given, is why the episode failed: every term and the reward are then 0
    (the metrics are still computed). `intact` may be passed when the caller has already
    checked the chain. A v2 case is graded by the v2 rubric (`suite_v2.grader`)."""
    if case.get("suite") == "v2":
        from .suite_v2.grader import grade_record as grade_v2
        return grade_v2(case, entries, mart, correct_mart, failure, intact)
    truth = {b["batch_id"]: b["truth"] for b in case["batches"]}
    acts = executed(entries)
    state = _state(acts)
    loads, quarantined = state["loads"], state["quarantined"]
    finished = state["report"] is not None
    if finished and not failure:
        terms = (disposition(truth, loads, quarantined, state["orphans_at_load"]),
                 report_term(state["report"], loads, quarantined),
                 evidence(truth, loads, quarantined),
                 _inspected(acts, {bid: staging_table(bid) for bid in truth}))
        reward = round(sum(WEIGHTS[k] * t for k, t in zip(TERMS, terms)), 6)
    else:
        terms, reward = (0.0, 0.0, 0.0, 0.0), 0.0
    return Grade(case["case_id"], case["family"], *terms, reward,
                 sum(1 for bid, t in truth.items() if t["defective"] and loads.get(bid, 0) >= 1),
                 sum(1 for bid in quarantined if bid in truth and not truth[bid]["defective"]),
                 round(abs(mart - correct_mart), 2), chain_intact(entries) if intact is None else intact,
                 finished, mart, correct_mart, bool(failure), failure)


def grade(episode, failure: str = "") -> Grade:
    """The grade of a live episode (a `tools.Episode`), from its ledger and its warehouse.

    A deferred ledger is sealed here: its chain is computed from the entries as they stand, so it
    is intact by construction and not computed a second time to check it."""
    prepared, ledger = episode.prepared, episode.ledger
    intact = True if ledger.deferred else None
    return grade_record(prepared.case, ledger.seal(), episode.world.revenue(), prepared.correct_mart, failure,
                        intact)


_correct: dict[str, float] = {}


def correct_mart(case: dict, case_json: str | None = None) -> float:
    """The mart a correct run of `case` gives (cached by the case's content, `case_json` when the
    caller has it: ids may repeat)."""
    key = case_json or json.dumps(case, sort_keys=True)
    if key not in _correct:
        if len(_correct) > 4096:
            _correct.clear()
        from .suites import prepare
        prepared = prepare(case)
        _correct[key] = prepared.correct_mart
        if hasattr(prepared, "close"):
            prepared.close()
    return _correct[key]


def grade_stored(stored: StoredEpisode) -> Grade:
    """Grade an episode the run store holds, from its stored ledger and warehouse, as any other.

    A stored episode that ended with an error, or that does not pass the store's checks (a broken
    or cut ledger, an altered case or warehouse, a record whose seal does not match), is a failed
    episode: it grades 0 with the reasons."""
    reasons = "; ".join(r for r in (stored.error, *stored.problems) if r)
    if stored.case is None:  # nothing to grade against: 0, with the reasons
        return zero_grade(stored.case_id, "?", reasons or "the stored case cannot be read")
    mart = stored.mart if stored.mart is not None else 0.0
    try:
        return grade_record(stored.case, stored.entries, mart, correct_mart(stored.case, stored.case_json),
                            reasons)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a stored case the grader cannot read
        return zero_grade(stored.case_id, str(stored.case.get("family", "?")),
                          f"{reasons + '; ' if reasons else ''}cannot be graded ({exc})")


def zero_grade(case_id: str, family: str, reason: str) -> Grade:
    """The grade of an episode that cannot be graded at all: 0 everywhere, failed, with the reason."""
    return Grade(case_id, family, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0.0, False, False, 0.0, 0.0, True, reason)


def exact_mean(values) -> Fraction:
    """Means computed exactly (from each value's %.9f form), so tables never drift by a digit."""
    values = list(values)
    return sum((Fraction("%.9f" % v) for v in values), Fraction(0)) / len(values) if values else Fraction(0)
