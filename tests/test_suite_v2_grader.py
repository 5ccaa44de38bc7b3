"""The v2 rubric, rule by rule: each test breaks one rule and checks the grade moves as documented
(row-level disposition, evidence per defect, inspected from what reads looked at, the cost of
questions), from episodes played through the tools and graded from the ledger and the warehouse."""
from __future__ import annotations

from pathlib import Path

import pytest

from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import Session, prepare
from gate_pipeline.kernel.records import WEIGHTS
from gate_pipeline.suites.v2.grader import RUBRIC

ROOT = Path(__file__).resolve().parent.parent
CASES = {c.case_id: c for c in read_cases(ROOT / "cases" / "v2" / "eval_curated.jsonl")}


def batches(case_id):
    case = CASES[case_id]
    return {b["table"]: b for b in case.data["batches"]}


def play(case_id, calls):
    s = Session(prepare(CASES[case_id]))
    for tool, args in calls:
        s.call(tool, args)
    return s.finish().grade


def look(b):
    return ("profile_batch", {"batch_id": b["batch_id"]})


def load(b):
    return ("load_batch", {"batch_id": b["batch_id"]})


def hold(b, keys, column, defect):
    return ("quarantine_rows", {"batch_id": b["batch_id"], "keys": keys, "column": column, "defect_type": defect})


def report(loaded, quarantined=()):
    return ("submit_report", {"loaded": sorted(b["batch_id"] for b in loaded),
                              "quarantined": sorted(b["batch_id"] for b in quarantined)})


PARTIAL = "v2-eval-partial-defect-0"  # an orders batch with two blank amounts (rows), a clean customers batch


def test_the_right_row_quarantine_scores_1():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    g = play(PARTIAL, [look(c), load(c), look(o), hold(o, bad, "amount", "missing_value"), load(o), report([c, o])])
    assert (g.disposition, g.report, g.evidence, g.inspected, g.reward) == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert (g.metrics["bad_rows_loaded"], g.metrics["clean_rows_lost"], g.revenue_error_usd) == (0, 0, 0.0)


def test_quarantining_the_whole_batch_loses_its_clean_rows():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    g = play(PARTIAL, [look(c), load(c), look(o),
                       ("quarantine_batch", {"batch_id": o["batch_id"], "column": "amount", "defect_type": "missing_value"}),
                       report([c], [o])])
    assert g.disposition == pytest.approx((1.0 + 0.5) / 2)  # bad rows out (half), no clean row in (half)
    assert g.metrics["clean_rows_lost"] == o["row_count"] - 2
    assert g.metrics["bad_rows_loaded"] == 0 and g.evidence == 1.0


def test_loading_the_bad_rows_costs_half_the_batch_and_its_evidence():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    g = play(PARTIAL, [look(c), load(c), look(o), load(o), report([c, o])])
    assert g.disposition == pytest.approx((1.0 + 0.5) / 2) and g.evidence == 0.0 and g.metrics["bad_rows_loaded"] == 2


def test_holding_back_a_clean_row_too_costs_its_share():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    clean_key = next(line.split(",")[0] for line in o["csv"].splitlines()[1:] if line.split(",")[0] not in bad)
    g = play(PARTIAL, [look(c), load(c), look(o), hold(o, [*bad, clean_key], "amount", "missing_value"), load(o),
                       report([c, o])])
    clean = o["row_count"] - 2
    assert g.disposition == pytest.approx((1.0 + 0.5 + 0.5 * (clean - 1) / clean) / 2)
    assert g.metrics["clean_rows_lost"] == 1


def test_loading_a_batch_twice_loads_no_clean_row_right():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    g = play(PARTIAL, [look(c), load(c), load(c), look(o), hold(o, bad, "amount", "missing_value"), load(o),
                       report([c, o])])
    assert g.disposition == pytest.approx(0.5)


def test_orders_loaded_before_their_customers_are_not_loaded_right():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    g = play(PARTIAL, [look(o), hold(o, bad, "amount", "missing_value"), load(o), look(c), load(c), report([c, o])])
    assert g.disposition < 1.0 and g.revenue_error_usd == 0.0  # the mart is right by morning; the load was not


def test_evidence_per_defect_counts_each_defect_and_takes_off_wrong_citations():
    case_id = "v2-eval-multi-defect-2"  # three defects: wrong_type, invalid_value, orphan_reference
    b = batches(case_id)
    o, c = b["orders"], b["customers"]
    defects = o["truth"]["defects"]
    quarantine = ("quarantine_batch", {"batch_id": o["batch_id"], "column": defects[0]["column"],
                                       "defect_type": defects[0]["type"]})

    def cite(column, kind):
        return ("cite_defect", {"batch_id": o["batch_id"], "column": column, "defect_type": kind})
    base = [look(c), load(c), look(o), quarantine]
    assert play(case_id, base + [report([c], [o])]).evidence == pytest.approx(1 / 3)
    assert play(case_id, base + [cite(d["column"], d["type"]) for d in defects[1:]] + [report([c], [o])]).evidence == 1.0
    spray = base + [cite(d["column"], d["type"]) for d in defects[1:]] + [cite("note", "unit_shift")]
    assert play(case_id, spray + [report([c], [o])]).evidence == pytest.approx(2 / 3)


def test_evidence_of_a_quarantined_batch_that_was_loaded_first_is_zero():
    case_id = "v2-eval-unit-shift-0"
    b = batches(case_id)
    o, c = b["orders"], b["customers"]
    g = play(case_id, [look(c), load(c), look(o), load(o),
                       ("quarantine_batch", {"batch_id": o["batch_id"], "column": "amount", "defect_type": "unit_shift"}),
                       report([c, o], [o])])
    assert g.evidence == 0.0 and g.disposition == 0.5 and g.bad_batches_loaded == 1


def test_inspected_needs_a_read_whose_result_or_work_depended_on_the_rows():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]

    def read(batch, where):
        return ("run_sql", {"query": f"SELECT COUNT(*) FROM stg_{batch['batch_id'].lower().replace('-', '_')} {where}"})
    acts = [load(c), hold(o, bad, "amount", "missing_value"), load(o), report([c, o])]
    assert play(PARTIAL, [read(c, "WHERE 0"), read(o, "WHERE 0"), *acts]).inspected == 0.0
    assert play(PARTIAL, [read(c, ""), read(o, "WHERE 0"), *acts]).inspected == 0.5
    assert play(PARTIAL, [read(c, ""), read(o, "WHERE amount = 'x'"), *acts]).inspected == 1.0


def test_questions_the_contract_does_not_leave_open_cost_and_the_reward_never_goes_below_zero():
    case_id = "v2-eval-ask-the-owner-3"  # CAD rows: the owner rules on currency in the orders batch
    b = batches(case_id)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    right = [look(c), load(c), look(o), hold(o, bad, "currency", "wrong_currency"), load(o), report([c, o])]
    free = ("ask_owner", {"batch_id": o["batch_id"], "column": "currency", "question": "CAD?"})
    paid = ("ask_owner", {"batch_id": o["batch_id"], "column": "status", "question": "?"})
    assert play(case_id, [free, *right]).reward == 1.0
    g = play(case_id, [free, paid, paid, *right])
    assert g.metrics["question_cost"] == pytest.approx(0.04) and g.reward == pytest.approx(0.96)
    g = play(case_id, [paid] * 60 + [report([])])
    assert g.reward == 0.0 and g.metrics["question_cost"] == pytest.approx(1.2)


def test_no_report_no_credit_and_a_failure_scores_zero():
    b = batches(PARTIAL)
    c = b["customers"]
    g = play(PARTIAL, [look(c), load(c)])
    assert (g.reward, g.disposition, g.finished) == (0.0, 0.0, False)
    s = Session(prepare(CASES[PARTIAL]))
    s.call("submit_report", {"loaded": [], "quarantined": []})
    failed = s.finish("RuntimeError: boom").grade
    assert failed.reward == 0.0 and failed.failed and failed.reason == "RuntimeError: boom"


def test_the_report_must_name_what_happened():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    g = play(PARTIAL, [look(c), load(c), look(o), hold(o, bad, "amount", "missing_value"), load(o), report([c])])
    assert g.report == 0.0 and g.reward == pytest.approx(1.0 - WEIGHTS["report"])


def test_a_stored_ledger_regrades_the_same_and_an_edit_is_seen():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = o["truth"]["defects"][0]["keys"]
    s = Session(prepare(CASES[PARTIAL]))
    for tool, args in [look(c), load(c), look(o), hold(o, bad, "amount", "missing_value"), load(o), report([c, o])]:
        s.call(tool, args)
    result = s.finish()
    g = result.grade
    again = RUBRIC.grade(CASES[PARTIAL], result.ledger, g.revenue, g.correct_revenue)
    assert again == g
    edited = [dict(e) for e in result.ledger]
    edited[3] = {**edited[3], "args": {**edited[3]["args"], "keys": bad[:1]}}  # claim only one row was held
    tampered = RUBRIC.grade(CASES[PARTIAL], edited, g.revenue, g.correct_revenue)
    assert not tampered.ledger_intact and tampered.disposition < 1.0
