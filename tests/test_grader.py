"""Each grader rule, tested so that breaking the rule fails a test. Scenarios are played
through the tools; the grade is read back from the ledger and the warehouse."""
from __future__ import annotations

import pytest

from gate_pipeline.kernel.grading import grade
from gate_pipeline.kernel.records import WEIGHTS
from gate_pipeline.suites.classic.grader import RUBRIC


def Episode(p):
    """An episode of a prepared case, as its suite plays it."""
    return p.suite.episode(p)


def split(p):
    bad = [b for b in p.order if p.truth[b]["defective"]]
    clean = [b for b in p.order if not p.truth[b]["defective"]]
    return clean, bad


def run(p, calls):
    ep = Episode(p)
    for tool, args in calls:
        ep.call(tool, args)
    g = grade(ep)
    ep.close()
    return g


def look(bid):
    return ("profile_batch", {"batch_id": bid})


def load(bid):
    return ("load_batch", {"batch_id": bid})


def quar(bid, column, kind):
    return ("quarantine_batch", {"batch_id": bid, "column": column, "defect_type": kind})


def report(loaded, quarantined):
    return ("submit_report", {"loaded": loaded, "quarantined": quarantined})


@pytest.fixture
def resent(prepared):
    return prepared["eval-resent-rows-0"]


def perfect(p):
    clean, bad = split(p)
    calls = [look(b) for b in p.order]
    calls += [load(b) for b in clean] + [quar(b, "order_id", "duplicate_key") for b in bad]
    return calls + [report(clean, bad)]


def test_perfect_play_scores_one(resent):
    g = run(resent, perfect(resent))
    assert g.reward == 1.0 and g.finished and g.revenue_error_usd == 0.0
    assert g.clean_batches_refused == 0 and not g.failed and g.reason == ""
    assert g.revenue == g.correct_revenue == resent.correct_mart


# -- disposition -------------------------------------------------------------------------------
def test_defective_batch_loaded_is_wrong(resent):
    clean, bad = split(resent)
    g = run(resent, [look(b) for b in resent.order] + [load(b) for b in resent.order] + [report(resent.order, [])])
    assert g.disposition == 0.5 and g.bad_batches_loaded == 1 and g.revenue_error_usd > 0


def test_defective_batch_left_in_staging_is_wrong(resent):
    clean, bad = split(resent)
    g = run(resent, [look(clean[0]), load(clean[0]), report(clean, [])])
    assert g.disposition == 0.5


def test_clean_batch_loaded_twice_is_wrong(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [load(clean[0]), load(clean[0]), quar(bad[0], "order_id", "duplicate_key")]
    g = run(resent, calls + [report(clean, bad)])
    assert g.disposition == 0.5 and g.revenue_error_usd > 0


def test_orders_loaded_before_their_customers_is_wrong(prepared):
    p = prepared["eval-legit-edge-2"]
    orders = [b for b in p.order if p.batches[b].table == "orders"][0]
    customers = [b for b in p.order if p.batches[b].table == "customers"][0]
    calls = [look(orders), look(customers)]
    wrong = run(p, calls + [load(orders), load(customers), report([orders, customers], [])])
    right = run(p, calls + [load(customers), load(orders), report([orders, customers], [])])
    assert wrong.disposition == 0.5 and right.disposition == 1.0
    assert wrong.revenue_error_usd == right.revenue_error_usd == 0.0  # the mart joins the same rows


def test_clean_batch_quarantined_after_one_load_still_counts_as_loaded(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [load(clean[0]), quar(clean[0], "amount", "out_of_range"),
                                               quar(bad[0], "order_id", "duplicate_key")]
    g = run(resent, calls + [report(clean, clean + bad)])
    assert g.disposition == 1.0 and g.evidence == 0.0 and g.report == 1.0


# -- report ------------------------------------------------------------------------------------
def test_report_must_match_what_happened(resent):
    clean, bad = split(resent)
    base = [look(b) for b in resent.order] + [load(clean[0]), quar(bad[0], "order_id", "duplicate_key")]
    assert run(resent, base + [report(clean, bad)]).report == 1.0
    assert run(resent, base + [report(clean + bad, [])]).report == 0.0
    assert run(resent, base + [report(clean + clean, bad)]).report == 0.0  # duplicates
    assert run(resent, base + [report([clean[0].lower()], bad)]).report == 0.0  # wrong case
    assert run(resent, base + [report(clean, [])]).report == 0.0


def test_loaded_then_quarantined_batch_must_be_in_both_lists(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [load(b) for b in resent.order] + [quar(bad[0], "order_id", "duplicate_key")]
    assert run(resent, calls + [report(resent.order, bad)]).report == 1.0
    assert run(resent, calls + [report(clean, bad)]).report == 0.0


# -- evidence ----------------------------------------------------------------------------------
def test_citation_must_match_column_and_type(resent):
    clean, bad = split(resent)
    base = [look(b) for b in resent.order] + [load(clean[0])]
    assert run(resent, base + [quar(bad[0], "order_id", "duplicate_key"), report(clean, bad)]).evidence == 1.0
    assert run(resent, base + [quar(bad[0], "order_id", "missing_value"), report(clean, bad)]).evidence == 0.0
    assert run(resent, base + [quar(bad[0], "amount", "duplicate_key"), report(clean, bad)]).evidence == 0.0


def test_either_accepted_reading_counts(prepared):
    p = prepared["eval-blank-amount-0"]
    clean, bad = split(p)
    base = [look(b) for b in p.order] + [load(clean[0])]
    for kind in ("missing_value", "out_of_range"):
        assert run(p, base + [quar(bad[0], "amount", kind), report(clean, bad)]).evidence == 1.0
    assert run(p, base + [quar(bad[0], "amount", "invalid_value"), report(clean, bad)]).evidence == 0.0


def test_quarantine_after_load_earns_no_evidence(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [load(b) for b in resent.order] + [quar(bad[0], "order_id", "duplicate_key")]
    assert run(resent, calls + [report(resent.order, bad)]).evidence == 0.0


def test_each_clean_batch_quarantined_cancels_a_hit(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [quar(bad[0], "order_id", "duplicate_key"), quar(clean[0], "amount", "out_of_range")]
    g = run(resent, calls + [report([], resent.order)])
    assert g.evidence == 0.0 and g.disposition == 0.5
    assert g.clean_batches_refused == 1 and g.bad_batches_loaded == 0


def test_evidence_with_no_defective_batch(prepared):
    p = prepared["eval-clean-control-0"]
    assert run(p, [load(b) for b in p.order] + [report(p.order, [])]).evidence == 1.0
    g = run(p, [load(p.order[0]), quar(p.order[1], "amount", "out_of_range"), report([p.order[0]], [p.order[1]])])
    assert g.evidence == 0.0


# -- inspected ---------------------------------------------------------------------------------
def test_inspected_needs_a_look_before_the_first_action(resent):
    clean, bad = split(resent)
    late = [load(clean[0]), look(clean[0]), look(bad[0]), quar(bad[0], "order_id", "duplicate_key"), report(clean, bad)]
    assert run(resent, late).inspected == 0.5


def test_query_reading_the_staging_table_counts_a_comment_does_not(resent):
    clean, bad = split(resent)
    s = resent.staging
    calls = [("run_sql", {"query": f"SELECT 1 -- {s[clean[0]]}"}), ("run_sql", {"query": f"SELECT 1 FROM {s[bad[0]]} WHERE 0"}),
             load(clean[0]), quar(bad[0], "order_id", "duplicate_key"), report(clean, bad)]
    assert run(resent, calls).inspected == 0.5


def test_refused_actions_are_not_actions(resent):
    clean, bad = split(resent)
    calls = [quar(bad[0], "nope", "duplicate_key"), look(bad[0]), quar(bad[0], "order_id", "duplicate_key"),
             ("profile_batch", {"batch_id": "B-unknown"}), report([], bad)]
    g = run(resent, calls)
    assert g.inspected == 1.0


def test_inspected_is_zero_when_nothing_was_acted_on(resent):
    assert run(resent, [look(b) for b in resent.order] + [report([], [])]).inspected == 0.0
    assert RUBRIC.fold(resent.case, []).inspected == 0.0


# -- reward, no report no credit, metrics ------------------------------------------------------
def test_reward_is_the_weighted_sum(resent):
    clean, bad = split(resent)
    g = run(resent, [load(clean[0]), quar(bad[0], "order_id", "missing_value"), report(clean, bad)])
    expect = round(sum(WEIGHTS[t] * getattr(g, t) for t in WEIGHTS), 6)
    assert g.reward == expect and (g.disposition, g.report, g.evidence, g.inspected) == (1.0, 1.0, 0.0, 0.0)
    assert g.reward == 0.7


def test_no_report_no_credit_but_metrics_survive(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [load(b) for b in resent.order]
    g = run(resent, calls)
    assert not g.finished and g.reward == 0.0
    assert all(getattr(g, t) == 0.0 for t in WEIGHTS)
    assert g.bad_batches_loaded == 1 and g.revenue_error_usd > 0 and g.ledger_intact


def test_revenue_error_counts_whole_batches(resent):
    clean, bad = split(resent)
    g = run(resent, [load(b) for b in resent.order] + [report(resent.order, [])])
    bad_total = sum(float(r["amount"]) for r in resent.batches[bad[0]].data["rows"])
    # every row of the bad batch reaches the mart when its customer exists: valid rows too
    assert g.revenue_error_usd == pytest.approx(bad_total, abs=0.01)


def test_doing_nothing_scores_the_documented_floor(prepared):
    from gate_pipeline.kernel.grading import exact_mean
    rewards = [run(p, [report([], [])]).reward for p in prepared.values()]
    assert float(exact_mean(rewards)) == 0.2375


# -- failed episodes ---------------------------------------------------------------------------
def test_a_failed_episode_scores_zero_on_every_term_but_keeps_its_metrics(resent):
    clean, bad = split(resent)
    calls = [look(b) for b in resent.order] + [load(b) for b in resent.order] + [report(resent.order, [])]
    ep = Episode(resent)
    for tool, args in calls:
        ep.call(tool, args)
    ok, failed = grade(ep), grade(ep, "RuntimeError: model went away")
    ep.close()
    assert ok.reward > 0.0 and not ok.failed
    assert failed.failed and failed.reason == "RuntimeError: model went away"
    assert failed.reward == 0.0 and all(getattr(failed, t) == 0.0 for t in WEIGHTS)
    # what happened is still measured
    metrics = ("bad_batches_loaded", "clean_batches_refused", "revenue_error_usd", "ledger_intact", "finished")
    assert {m: getattr(failed, m) for m in metrics} == {m: getattr(ok, m) for m in metrics}
    assert failed.bad_batches_loaded == 1 and failed.revenue_error_usd > 0 and failed.ledger_intact and failed.finished


def test_grade_record_is_the_grade_of_the_ledger_and_the_mart(resent):
    ep = Episode(resent)
    for tool, args in perfect(resent):
        ep.call(tool, args)
    live, mart = grade(ep), ep.world.revenue()
    entries = ep.ledger.entries
    ep.close()
    assert RUBRIC.grade(resent.case, entries, mart, resent.correct_mart) == live
    failed = RUBRIC.grade(resent.case, entries, mart, resent.correct_mart, failure="lost")
    assert failed.as_dict() == {**live.as_dict(), **{t: 0.0 for t in WEIGHTS}, "reward": 0.0,
                                "failed": True, "reason": "lost"}


def test_exact_mean_is_the_mean_of_each_values_nine_decimal_form():
    """`exact_mean` sums whole billionths rather than a Fraction per value: the same Fraction as the mean of
    each value's %.9f text read as a Fraction, for negative, tiny, large and rounding values alike."""
    import random
    from fractions import Fraction

    from gate_pipeline.kernel.grading import exact_mean
    rng = random.Random(7)
    samples = [[0.2375], [-0.5, 0.25], [1e-10, -1e-10, 5e-10], [123456789.123456789, -0.0], [0.1] * 7,
               [rng.uniform(-2, 2) for _ in range(500)], [rng.random() * 10 ** rng.randint(-12, 12) for _ in range(200)]]
    for values in samples:
        assert exact_mean(values) == sum((Fraction("%.9f" % v) for v in values), Fraction(0)) / len(values)
    assert exact_mean([]) == 0 and exact_mean(iter([1.0, 0.0])) == Fraction(1, 2)
    with pytest.raises(ValueError):
        exact_mean([float("nan")])
