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


PARTIAL = "v2-eval-partial-defect-0-b"  # an orders batch with a blank amount and a decimal comma (rows), clean customers


def right(b):
    """The calls that handle a batch the contract's way when it is clean or to be loaded by rows."""
    assert b["truth"]["disposition"] in ("load", "rows"), b["truth"]
    return [*hold_all(b), load(b)] if b["truth"]["disposition"] == "rows" else [load(b)]


def hold_all(b):
    """The row quarantines of every defect of a rows batch, as the contract asks (one per column and type)."""
    return [hold(b, d["keys"], d["column"], d["type"]) for d in b["truth"]["defects"]]


def bad_keys(b):
    return sorted({k for d in b["truth"]["defects"] for k in d.get("keys", ())})


def test_the_partial_case_is_what_these_tests_expect():
    b = batches(PARTIAL)
    assert b["orders"]["truth"]["disposition"] == "rows" and not b["customers"]["truth"]["defective"]
    assert {(d["column"], d["type"]) for d in b["orders"]["truth"]["defects"]} == {("amount", "missing_value"),
                                                                                  ("amount", "wrong_type")}


def test_the_right_row_quarantine_scores_1():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    g = play(PARTIAL, [look(c), load(c), look(o), *hold_all(o), load(o), report([c, o])])
    assert (g.disposition, g.report, g.evidence, g.inspected, g.reward) == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert (g.metrics["bad_rows_loaded"], g.metrics["clean_rows_lost"], g.revenue_error_usd) == (0, 0, 0.0)


def test_a_row_quarantined_batch_is_reported_as_loaded_only():
    """The tool's answer, its description and the contract say so; the grader holds the agent to it."""
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    s = Session(prepare(CASES[PARTIAL]))
    for tool, args in [look(c), load(c), look(o), *hold_all(o)]:
        answer = s.call(tool, args)
    assert answer["status"] == "held" and "under loaded" in answer["next"]
    tools = {t.name: t.description for t in s.tools.suite.tools}
    assert "report it under loaded" in tools["quarantine_rows"] and "rows held back" in tools["submit_report"]
    assert "the report lists it under loaded" in CASES[PARTIAL].contract["row_quarantine"]["rule"]
    s.call(*load(o))
    s.call(*report([c, o], [o]))  # also listed as quarantined: not what happened
    assert s.finish().grade.report == 0.0


def test_quarantining_the_whole_batch_loses_its_clean_rows():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    (first, *rest) = o["truth"]["defects"]
    g = play(PARTIAL, [look(c), load(c), look(o),
                       ("quarantine_batch", {"batch_id": o["batch_id"], "column": first["column"],
                                             "defect_type": first["type"]}),
                       *[("cite_defect", {"batch_id": o["batch_id"], "column": d["column"], "defect_type": d["type"]})
                         for d in rest],
                       report([c], [o])])
    assert g.disposition == pytest.approx((1.0 + 0.5) / 2)  # bad rows out (half), no clean row in (half)
    assert g.metrics["clean_rows_lost"] == o["row_count"] - len(bad_keys(o))
    # and no evidence: the contract holds such a batch back by rows, so a whole quarantine is no finding (a
    # guess that a batch hides a bad row gains nothing by quarantining it whole)
    assert g.metrics["bad_rows_loaded"] == 0 and g.evidence == 0.0


def test_holding_back_more_rows_than_the_contract_holds_back_is_no_finding():
    """Every row held back (with the right citations), then the batch loaded: no clean row is in, and as
    with a whole quarantine the batch earns no evidence (a guess that a batch hides a bad row gains
    nothing by holding back all of it)."""
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    keys = [line.split(",")[0] for line in o["csv"].splitlines()[1:]]
    assert len(keys) > CASES[PARTIAL].contract["row_quarantine"]["max_rows"]
    first, *rest = o["truth"]["defects"]
    calls = [hold(o, [k for k in keys if k not in bad_keys(o)] + first["keys"], first["column"], first["type"]),
             *[hold(o, d["keys"], d["column"], d["type"]) for d in rest]]
    g = play(PARTIAL, [look(c), load(c), look(o), *calls, load(o), report([c, o])])
    assert g.disposition == pytest.approx((1.0 + 0.5) / 2) and g.evidence == 0.0
    assert g.metrics["clean_rows_lost"] == o["row_count"] - len(bad_keys(o))
    right_way = play(PARTIAL, [look(c), load(c), look(o), *hold_all(o), load(o), report([c, o])])
    assert right_way.evidence == 1.0


def test_loading_the_bad_rows_costs_half_the_batch_and_its_evidence():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    g = play(PARTIAL, [look(c), load(c), look(o), load(o), report([c, o])])
    assert g.disposition == pytest.approx((1.0 + 0.5) / 2) and g.evidence == 0.0
    assert g.metrics["bad_rows_loaded"] == len(bad_keys(o))


def test_holding_back_a_clean_row_too_costs_its_share():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    bad = bad_keys(o)
    clean_key = next(line.split(",")[0] for line in o["csv"].splitlines()[1:] if line.split(",")[0] not in bad)
    g = play(PARTIAL, [look(c), load(c), look(o), *hold_all(o), hold(o, [clean_key], "amount", "missing_value"),
                       load(o), report([c, o])])
    clean = o["row_count"] - len(bad)
    assert g.disposition == pytest.approx((1.0 + 0.5 + 0.5 * (clean - 1) / clean) / 2)
    assert g.metrics["clean_rows_lost"] == 1


def test_loading_a_batch_twice_loads_no_clean_row_right():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    g = play(PARTIAL, [look(c), load(c), load(c), look(o), *hold_all(o), load(o), report([c, o])])
    assert g.disposition == pytest.approx(0.5)


def test_orders_loaded_before_their_customers_are_not_loaded_right():
    def late_reference_on_a_clean_night(c):
        tables = {b["table"]: b for b in c.data["batches"]}
        return not any(b["truth"]["defective"] for b in tables.values()) and any(
            line.split(",")[1] in tables["customers"]["csv"] for line in tables["orders"]["csv"].splitlines()[1:])
    case = next(c for c in [*CASES.values(), *read_cases(ROOT / "cases" / "v2" / "train_procedural.jsonl")]
                if late_reference_on_a_clean_night(c))
    CASES.setdefault(case.case_id, case)
    case_id = case.case_id
    b = batches(case_id)  # clean batches, and an order whose customer arrives tonight
    o, c = b["orders"], b["customers"]
    g = play(case_id, [look(o), load(o), look(c), load(c), report([c, o])])
    assert g.disposition < 1.0 and g.revenue_error_usd == 0.0  # the mart is right by morning; the load was not
    assert play(case_id, [look(c), load(c), look(o), load(o), report([c, o])]).reward == 1.0


def test_evidence_per_defect_counts_each_defect_and_takes_off_wrong_citations():
    case_id = "v2-eval-multi-defect-2-b"  # customers: three defects: duplicate_key, missing_value, invalid_value
    b = batches(case_id)
    o, c = b["orders"], b["customers"]
    defects = c["truth"]["defects"]
    assert len(defects) == 3 and not o["truth"]["defective"]
    quarantine = ("quarantine_batch", {"batch_id": c["batch_id"], "column": defects[0]["column"],
                                       "defect_type": defects[0]["type"]})

    def cite(column, kind):
        return ("cite_defect", {"batch_id": c["batch_id"], "column": column, "defect_type": kind})
    base = [look(c), quarantine, look(o), load(o)]
    assert play(case_id, base + [report([o], [c])]).evidence == pytest.approx(1 / 3)
    assert play(case_id, base + [cite(d["column"], d["type"]) for d in defects[1:]] + [report([o], [c])]).evidence \
        == 1.0
    spray = base + [cite(d["column"], d["type"]) for d in defects[1:]] + [cite("email", "unit_shift")]
    assert play(case_id, spray + [report([o], [c])]).evidence == pytest.approx(2 / 3)


def test_one_citation_is_credited_to_one_defect():
    """Two defects that both accept a citation: citing it once covers one of them, not both."""
    import copy

    from gate_pipeline.kernel.cases import load_case
    data = copy.deepcopy(CASES["v2-eval-multi-defect-1"].data)  # orders: unit_shift and volume_anomaly
    o = next(b for b in data["batches"] if b["table"] == "orders")
    assert {d["type"] for d in o["truth"]["defects"]} == {"unit_shift", "volume_anomaly"}
    for d in o["truth"]["defects"]:
        d["accepted"] = [{"column": "amount", "type": "unit_shift"}, *d.get("accepted", [])]
    case = load_case(data)
    s = Session(prepare(case))
    c = next(b for b in data["batches"] if b["table"] == "customers")
    for tool, args in [look(c), *right(c), look(o),
                       ("quarantine_batch", {"batch_id": o["batch_id"], "column": "amount", "defect_type": "unit_shift"}),
                       report([c], [o])]:
        s.call(tool, args)
    assert s.finish().grade.evidence == pytest.approx((1 + 1 / 2) / 2)  # the customers' rows, one of two defects
    from gate_pipeline.suites.v2.grader import credited
    defects = o["truth"]["defects"]
    assert credited([("amount", "unit_shift")], defects) == 1
    assert credited([("amount", "unit_shift"), ("order_id", "volume_anomaly")], defects) == 2
    assert credited([("order_id", "volume_anomaly"), ("amount", "unit_shift")], defects) == 2  # order does not matter


def test_evidence_of_a_quarantined_batch_that_was_loaded_first_is_zero():
    case_id = "v2-eval-unit-shift-1"  # orders in cents; customers done right
    b = batches(case_id)
    o, c = b["orders"], b["customers"]
    g = play(case_id, [look(c), *right(c), look(o), load(o),
                       ("quarantine_batch", {"batch_id": o["batch_id"], "column": "amount", "defect_type": "unit_shift"}),
                       report([c, o], [o])])
    customers = 1.0 if c["truth"]["defective"] else 0.0  # the customers' evidence, if they have any
    assert g.evidence == customers / (1 + customers) and g.disposition == 0.5 and g.bad_batches_loaded == 1


def test_inspected_needs_a_read_whose_result_or_work_depended_on_the_rows():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]

    def read(batch, where):
        return ("run_sql", {"query": f"SELECT COUNT(*) FROM stg_{batch['batch_id'].lower().replace('-', '_')} {where}"})
    acts = [load(c), *hold_all(o), load(o), report([c, o])]
    assert play(PARTIAL, [read(c, "WHERE 0"), read(o, "WHERE 0"), *acts]).inspected == 0.0
    assert play(PARTIAL, [read(c, ""), read(o, "WHERE 0"), *acts]).inspected == 0.5
    assert play(PARTIAL, [read(c, ""), read(o, "WHERE amount = 'x'"), *acts]).inspected == 1.0


def test_questions_cost_exactly_as_the_contract_words_them_and_the_reward_never_goes_below_zero():
    case_id = "v2-eval-ask-the-owner-3"  # a USD spelling the owner rejects: rows of the orders batch
    b = batches(case_id)
    o, c = b["orders"], b["customers"]
    assert CASES[case_id].contract["ask_owner"]["columns"] == ["currency", "country"]
    done = [look(c), *right(c), look(o), *hold_all(o), load(o), report([c, o])]
    free = ("ask_owner", {"batch_id": o["batch_id"], "column": "currency", "value": "usd", "question": "accept?"})
    also_free = ("ask_owner", {"batch_id": c["batch_id"], "column": "country", "value": "NZ",
                               "question": "a new market?"})
    paid = ("ask_owner", {"batch_id": o["batch_id"], "column": "status", "value": "?", "question": "?"})
    assert play(case_id, [free, also_free, *done]).reward == 1.0  # a column ask_owner.columns names: free,
    g = play(case_id, [free, paid, paid, *done])                  # with or without a ruling to give
    assert g.metrics["question_cost"] == pytest.approx(0.04) and g.reward == pytest.approx(0.96)
    g = play(case_id, [paid] * 60 + [report([])])
    assert g.reward == 0.0 and g.metrics["question_cost"] == pytest.approx(1.2)
    s = Session(prepare(CASES[case_id]))  # the tool says what the grader charges
    assert s.call(*also_free)["cost"] == 0.0 and s.call(*paid)["cost"] == 0.02
    s.finish()


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
    g = play(PARTIAL, [look(c), load(c), look(o), *hold_all(o), load(o), report([c])])
    assert g.report == 0.0 and g.reward == pytest.approx(1.0 - WEIGHTS["report"])


def test_a_stored_ledger_regrades_the_same_and_an_edit_is_seen():
    b = batches(PARTIAL)
    o, c = b["orders"], b["customers"]
    s = Session(prepare(CASES[PARTIAL]))
    for tool, args in [look(c), load(c), look(o), *hold_all(o), load(o), report([c, o])]:
        s.call(tool, args)
    result = s.finish()
    g = result.grade
    again = RUBRIC.grade(CASES[PARTIAL], result.ledger, g.revenue, g.correct_revenue)
    assert again == g
    edited = [dict(e) for e in result.ledger]
    assert edited[3]["action"] == "quarantine_rows"
    edited[3] = {**edited[3], "args": {**edited[3]["args"], "keys": []}}  # claim those rows were not held
    tampered = RUBRIC.grade(CASES[PARTIAL], edited, g.revenue, g.correct_revenue)
    assert not tampered.ledger_intact and tampered.disposition < 1.0
