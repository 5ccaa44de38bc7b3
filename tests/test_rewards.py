"""The F003 dense step reward: every test vector of DENSE_REWARD.md, the clamp, repeats, Layer 2's cap."""
from __future__ import annotations

import hashlib
import json
import math
import random

import pytest

from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import prepare
from gate_pipeline.kernel.rewards import (
    EpisodeContext,
    _bin_progress,
    _cardinality_score,
    _layer2_progress,
    _numeric_range_score,
    _progress_level,
    _raw_progress,
    _value_overlap_score,
    action_key,
    compute_step_reward,
    step_parts,
)
from gate_pipeline.suites.classic.contract import COLUMNS
from gate_pipeline.suites.classic.gold import gold_rows

EVAL = "cases/classic/eval_curated.jsonl"
TINY = 1e-12


def ok(ctx, sql, rows=((1,),), action="QUERY"):
    return compute_step_reward(ctx, action, sql, [tuple(r) for r in rows], None)


# -- the test vectors ---------------------------------------------------------------------
def test_first_successful_select_1_pays_exactly_0_025():
    assert ok(EpisodeContext(), "SELECT 1") == 0.025


def test_the_same_query_again_pays_minus_0_015():
    ctx = EpisodeContext()
    ok(ctx, "SELECT 1")
    assert ok(ctx, "SELECT 1") == pytest.approx(-0.015, abs=TINY)


def test_repeat_key_ignores_white_space_and_trailing_semicolons_but_keeps_case():
    ctx = EpisodeContext()
    ok(ctx, "SELECT  *\n FROM t")
    assert ok(ctx, "  SELECT * FROM t ;; ") == pytest.approx(-0.015, abs=TINY)
    assert ok(ctx, "select * from t") == pytest.approx(0.025, abs=TINY)
    assert action_key("QUERY", "SELECT 1;") == action_key("QUERY", "SELECT 1")
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\u00a0", "\u2003", "\u2028", " ;"]
    rng = random.Random(5)
    for _ in range(500):
        words = ["SELECT", "a", "FROM", "t", ";"]
        sql = "".join(rng.choice(spaces) + w for w in words) + rng.choice(spaces)
        plain = " ".join(sql.split()).rstrip("; ").rstrip(";")
        assert action_key("QUERY", sql) == hashlib.sha256(plain.encode()).hexdigest(), repr(sql)


def test_a_syntax_error_pays_the_step_cost_only():
    ctx = EpisodeContext()
    assert compute_step_reward(ctx, "QUERY", "SELEC 1", None, "near 'SELEC': syntax error") == -0.005
    assert ctx.cumulative_new_info_reward == 0.0


def test_eleventh_distinct_query_has_no_new_info_left():
    ctx = EpisodeContext()
    paid = [ok(ctx, f"SELECT {i}") for i in range(11)]
    assert all(p == pytest.approx(0.025, abs=TINY) for p in paid[:10])
    assert paid[10] == pytest.approx(0.015, abs=TINY)
    assert ctx.cumulative_new_info_reward == pytest.approx(0.10, abs=TINY)


def test_running_total_0_49_leaves_0_010():
    ctx = EpisodeContext(cumulative_step_reward=0.49)
    assert ok(ctx, "SELECT 1") == pytest.approx(0.010, abs=TINY)
    assert ctx.cumulative_step_reward == 0.5


def test_running_total_at_the_cap_pays_nothing_and_a_loss_counts_in_full():
    ctx = EpisodeContext(cumulative_step_reward=0.5)
    assert ok(ctx, "SELECT 1") == 0.0
    assert compute_step_reward(ctx, "QUERY", "bad", None, "error") == pytest.approx(-0.005, abs=TINY)


@pytest.mark.parametrize("pred, gold, want", [
    ([(1,), (2,)], [(3,), (4,)], 1.0),
    ([], [(1,)], 0.0),
    ([], [], 1.0),
    ([(i,) for i in range(10)], [(1,)], 0.1),
    ([(1,)], [(1,), (2,), (3,), (4,)], 0.25),
])
def test_cardinality(pred, gold, want):
    assert _cardinality_score(pred, gold) == pytest.approx(want, abs=TINY)


@pytest.mark.parametrize("distance, want", [(0, 1.0), (1, 0.591), (10, 0.294)])
def test_numeric_proximity(distance, want):
    assert round(_numeric_range_score([(100.0 + distance,)], [(100.0,)]), 3) == want


@pytest.mark.parametrize("raw, want", [(0.1, 0.0), (0.125, 0.25), (0.5, 0.5), (0.874, 0.75), (0.875, 1.0)])
def test_bins(raw, want):
    assert _bin_progress(raw) == want


def test_a_query_returning_exactly_gold_pays_layer1_and_full_layer2():
    gold = [("O1", "C1", "160100.00", "USD", "placed", "2026-09-14")]
    ctx = EpisodeContext(gold_rows=list(gold))
    parts = step_parts(ctx, "QUERY", "SELECT * FROM stg WHERE CAST(amount AS REAL) > 50000", gold, None)
    assert parts["layer1"] == 0.025
    assert parts["layer2"] == 0.15
    assert parts["step"] == pytest.approx(0.175, abs=TINY)
    assert ctx.best_progress == 1.0


# -- the sub-scores beyond the vectors ----------------------------------------------------
def test_value_overlap_is_jaccard_of_cell_strings():
    assert _value_overlap_score([], []) == 1.0
    assert _value_overlap_score([(1, "a")], [("1", "b")]) == pytest.approx(1 / 3)
    assert _value_overlap_score([("x",)], [("y",)]) == 0.0


def test_numeric_range_edges():
    assert _numeric_range_score([("a",)], [("b",)]) == 1.0           # gold has no numeric cell
    assert _numeric_range_score([("a",)], [("5",)]) == 0.0           # pred has none
    assert _numeric_range_score([("nan", 7)], [("nan", "7")]) == 1.0  # NaN is not a number here
    nearest = _numeric_range_score([(0,), (9,), (30,)], [(10,)])
    assert nearest == pytest.approx(1 / (1 + math.log(2)))


def test_layer2_pays_improvement_only():
    gold = [("a", "1"), ("b", "2")]
    ctx = EpisodeContext(gold_rows=gold)
    first = _layer2_progress(ctx, [("a", "1")])
    assert first > 0 and ctx.best_progress < 1.0
    assert _layer2_progress(ctx, [("a", "1")]) == 0.0
    assert _layer2_progress(ctx, gold) == pytest.approx(0.15 - first, abs=TINY)
    assert _layer2_progress(ctx, gold) == 0.0


def test_the_fast_progress_level_pays_exactly_what_the_plain_formula_pays():
    rng = random.Random(11)
    cells = ["O1", "C1", "10.00", "USD", "-5", 3, 2.5, None, "", "x", "1e3", "nan", "inf"]
    for _ in range(3000):
        gold = [tuple(rng.choice(cells) for _ in range(3)) for _ in range(rng.randint(1, 4))]
        rows = [tuple(rng.choice(cells) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 6))]
        best = rng.choice([0.0, 0.25, 0.5, 0.75])
        exact = _bin_progress(_raw_progress(rows, gold))
        level = _progress_level(EpisodeContext(gold_rows=gold, best_progress=best), rows)
        assert level == exact if exact > best else level <= best, (gold, rows, best)


def test_empty_gold_skips_layer2():
    ctx = EpisodeContext()
    parts = step_parts(ctx, "QUERY", "SELECT 1", [(1,)], None)
    assert parts["layer2"] == 0.0 and ctx.best_progress == 0.0


def test_describe_and_sample_never_get_layer2():
    ctx = EpisodeContext(gold_rows=[("a",)])
    parts = step_parts(ctx, "SAMPLE", 'profile_batch{"batch_id":"a"}', [("a",)], None)
    assert parts == {"layer1": 0.025, "layer2": 0.0, "step": 0.025}


def test_unknown_action_type_is_refused():
    with pytest.raises(ValueError, match="action_type"):
        compute_step_reward(EpisodeContext(), "LOAD", "x", None, None)


# -- the properties of an episode ---------------------------------------------------------
def test_clamp_holds_over_long_random_episodes():
    rng = random.Random(7)
    gold = [("O1", "C1", "10.00")]
    for _ in range(50):
        ctx = EpisodeContext(gold_rows=gold)
        total = 0.0
        for _ in range(400):
            sql = f"SELECT {rng.randrange(60)}"
            error = "boom" if rng.random() < 0.3 else None
            rows = None if error else rng.choice([[("O1", "C1", "10.00")], [(1,)], []])
            total += compute_step_reward(ctx, "QUERY", sql, rows, error)
            assert -0.2 - TINY <= total <= 0.5 + TINY
            assert total == pytest.approx(ctx.cumulative_step_reward, abs=1e-9)


def test_many_distinct_successes_stop_at_the_cap_and_many_errors_at_the_floor():
    ctx = EpisodeContext()
    assert sum(ok(ctx, f"SELECT {i}") for i in range(100)) == pytest.approx(0.5, abs=1e-9)
    ctx = EpisodeContext()
    total = sum(compute_step_reward(ctx, "QUERY", f"bad {i}", None, "e") for i in range(100))
    assert total == pytest.approx(-0.2, abs=1e-9)


def test_repeats_never_pay():
    gold = [("O1", "C1", "10.00")]
    ctx = EpisodeContext(gold_rows=gold)
    ok(ctx, "SELECT 1", [])
    ok(ctx, 'list_batches{}', [], action="DESCRIBE")
    # the repeat returns different rows (the world changed), and would show progress: still no pay
    assert ok(ctx, "SELECT 1", gold) < 0
    assert ok(ctx, 'list_batches{}', [], action="DESCRIBE") < 0
    assert compute_step_reward(ctx, "QUERY", "SELECT 1", None, "e") < 0
    assert ctx.best_progress == 0.0


def test_layer2_pays_at_most_0_15_per_episode():
    gold = [("a", "1.5"), ("b", "2.5"), ("c", "3.5")]
    rng = random.Random(3)
    for _ in range(30):
        ctx = EpisodeContext(gold_rows=gold)
        paid = 0.0
        for i in range(60):
            rows = rng.sample(gold + [("z", str(i)), ("b", "9")], rng.randint(0, 5))
            paid += step_parts(ctx, "QUERY", f"SELECT {i}", rows, None)["layer2"]
        assert paid <= 0.15 + TINY


def test_gold_rows_of_the_eval_cases():
    by_family = {}
    for case in read_cases(EVAL):
        rows = gold_rows(case)
        by_family.setdefault(case.family, []).append(rows)
        defective = [b for b in case.batches if b.defective]
        assert bool(rows) == bool(defective)
        staged = {tuple(r[c] for c in COLUMNS[b.table]) for b in defective for r in b.data["rows"]}
        assert set(rows) <= staged  # raw staging values, in contract column order
    assert all(len(rows) == 1 and rows[0][2].strip() == "" for rows in by_family["blank-amount"])
    assert all(len(rows) == 1 for rows in by_family["amount-bounds"])
    assert all(len(rows) >= 2 for rows in by_family["resent-rows"])


def test_gold_rows_of_an_orphan_are_the_orders_whose_customer_is_unknown():
    for case in read_cases(EVAL):
        if case.family != "orphan-customer":
            continue
        known = {r["customer_id"] for r in case.data["warehouse"]["customers"]}
        rows = gold_rows(case)
        assert rows and all(r[1] not in known for r in rows)


# -- the reward modes the engine plays under (gate_pipeline.rewards) --------------------------
def test_reward_modes_and_their_shapers():
    from gate_pipeline.kernel.rewards import REWARD_MODES, DenseShaper, make_shaper
    prepared = prepare(read_cases(EVAL)[8])
    assert REWARD_MODES == ("terminal", "dense", "potential")
    assert make_shaper("terminal", prepared) is None
    shaper = make_shaper("dense", prepared)
    assert isinstance(shaper, DenseShaper) and shaper.ctx.gold_rows == prepared.gold_rows
    assert make_shaper("dense", prepared).ctx is not shaper.ctx  # per-episode state, never shared
    with pytest.raises(ValueError, match="reward must be one of"):
        make_shaper("shaped", prepared)


def test_prepared_gold_rows_are_the_gold_rows_computed_once():
    for case in read_cases(EVAL)[::5]:
        prepared = prepare(case)
        assert prepared.gold_rows == gold_rows(case)
        assert prepared.gold_rows is prepared.gold_rows  # cached on the prepared case


def test_call_key_is_the_tool_with_canonical_arguments():
    from gate_pipeline.kernel.rewards import call_key
    assert call_key("list_batches", {}) == "list_batches{}"
    assert call_key("quarantine_batch", {"column": "amount", "batch_id": "B"}) == \
        'quarantine_batch{"batch_id":"B","column":"amount"}'
    assert call_key("t", {"b": 1, "a": 2}) == call_key("t", {"a": 2, "b": 1})
    assert call_key("t", {1: 2, "a": 3}) == call_key("t", {1: 2, "a": 3})  # unsortable keys: no error
    assert call_key(None, "x") != call_key("None", {})
    # the key's JSON is json.dumps' with these options, whatever the arguments hold (its encoder is built once)
    from gate_pipeline.kernel.actions import preview
    for args in ({"batch_id": "B-\u00e9\u4e2d", "column": "a\"b\\c\n"}, {"loaded": ["B1", "B2"], "quarantined": []},
                 {"z": 1.5, "a": -0.0, "m": 10**30, "n": None, "t": True}, {"nested": {"b": [1, {"d": 2, "c": 3}]}},
                 {1: 2, "a": float("nan"), "b": float("inf")}, {"s": "\ud800", "x": "y" * 1001}):
        shown = args if all(isinstance(v, str) and len(v) <= 1000 for v in args.values()) else preview(args)
        assert call_key("t", args) == "t" + json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_shaped_parts_map_tools_to_action_types_and_leave_decisions_alone():
    from gate_pipeline.kernel.rewards import shaped_parts
    from gate_pipeline.suites.classic.tools import TOOLS
    tools = {t.name: t.shaped for t in TOOLS}  # the classic tools' action types (None: a decision)
    SHAPED = {name: kind for name, kind in tools.items() if kind is not None}
    UNSHAPED = {name for name, kind in tools.items() if kind is None}

    def shaped_parts(ctx, tool, args, result, _parts=shaped_parts):
        return _parts(ctx, tool, args, result, tools)
    assert SHAPED == {"read_contract": "DESCRIBE", "list_batches": "DESCRIBE", "profile_batch": "SAMPLE",
                      "run_sql": "QUERY"}
    ctx = EpisodeContext(gold_rows=[("O1", "C1", "10.00")])
    for tool in sorted(UNSHAPED):
        assert shaped_parts(ctx, tool, {"batch_id": "B"}, {"status": "loaded"}) is None
    assert ctx.query_hashes == set() and ctx.cumulative_step_reward == 0.0  # nothing recorded for them
    assert shaped_parts(ctx, "list_batches", {}, [])["step"] == 0.025
    assert shaped_parts(ctx, "list_batches", {}, [])["step"] == pytest.approx(-0.015, abs=TINY)  # a repeat
    assert shaped_parts(ctx, "profile_batch", {"batch_id": "B"}, {"error": "no batch 'B'"})["step"] == \
        pytest.approx(-0.005, abs=TINY)
    # a query is keyed by its text, as F003 keys it: white space and a trailing ';' do not make it new
    first = shaped_parts(ctx, "run_sql", {"query": "SELECT * FROM t"}, {"rows": [["O1", "C1", "10.00"]]})
    assert first == {"layer1": 0.025, "layer2": 0.15, "step": pytest.approx(0.175, abs=TINY)}
    again = shaped_parts(ctx, "run_sql", {"query": " SELECT *  FROM t;"}, {"rows": [["O1", "C1", "10.00"]]})
    assert again["layer2"] == 0.0 and again["step"] == pytest.approx(-0.015, abs=TINY)
    # a tool gate does not have, or a malformed action: a refused DESCRIBE, repeats penalised
    assert shaped_parts(ctx, "drop_table", {}, {"error": "unknown tool"})["step"] == pytest.approx(-0.005, abs=TINY)
    assert shaped_parts(ctx, None, "junk", {"error": "malformed"})["step"] == pytest.approx(-0.005, abs=TINY)
    assert shaped_parts(ctx, None, "junk", {"error": "malformed"})["step"] == pytest.approx(-0.015, abs=TINY)


def test_potential_shaping_sums_to_a_constant_of_the_case_so_agents_rank_as_under_the_rubric():
    """Every episode's shaping in `potential` mode sums to -Phi(s0): the return is the rubric's reward
    minus a constant of the case, for any policy, reporting or not, hacks included."""
    from gate_pipeline.kernel.engine import Session, play_cases
    from gate_pipeline.suites.classic import ATTACKERS, REWARD_HACKS
    cases = read_cases(EVAL)
    agents = ["careful-sql", "naive", "random", "refuse-all", "profile-only", *ATTACKERS, *REWARD_HACKS]
    potential = play_cases(cases, agents, reward="potential")
    for k, case in enumerate(cases):
        start = Session(prepare(case), reward="potential").shaper.phi
        assert start in (0.0, 0.15)  # evidence is 1.0 before anything happens when no batch is defective
        for name in agents:
            r = potential[name][k]
            assert abs(r.total_reward - (r.grade.reward - start)) < 1e-9, (name, case.case_id)
    # a policy that never reports: its return is still -Phi(s0), whatever it did first
    s = Session(prepare(cases[8]), reward="potential")
    for b in s.call("list_batches", {}):
        s.call("load_batch", {"batch_id": b["batch_id"]})
    assert abs(s.finish().total_reward + s.shaper.start) < 1e-9


def test_potential_pays_decisions_as_they_move_the_state():
    from gate_pipeline.kernel.engine import Session
    case = read_cases(EVAL)[8]  # eval-amount-bounds-0: one bad orders batch, one clean
    bad = next(b.batch_id for b in case.batches if b.defective)
    good = next(b.batch_id for b in case.batches if not b.defective)
    s = Session(prepare(case), reward="potential", stop_at_report=True)
    assert s.step(["list_batches", {}]).reward == 0.0  # nothing about the rubric's state moved
    right = s.step(["quarantine_batch", {"batch_id": bad, "column": "amount", "defect_type": "out_of_range"}])
    assert right.parts["potential"] > 0 and right.reward == right.parts["potential"]
    wrong = s.step(["load_batch", {"batch_id": bad}])  # refused: quarantined batches cannot load
    assert wrong.reward == 0.0
    loaded = s.step(["load_batch", {"batch_id": good}])
    assert loaded.reward > 0
    end = s.step(["submit_report", {"loaded": [good], "quarantined": [bad]}])
    assert end.terminated and abs(end.reward - (end.grade.reward - loaded.parts["potential"])) < 1e-9


@pytest.mark.parametrize("mode", ["potential", "dense", "terminal"])
def test_the_step_rewards_of_an_episode_cut_off_at_its_step_limit_sum_to_its_return(mode):
    """A step that cut the episode off at max_steps returned the reward read before the episode was finished, so a
    potential episode's last step kept Phi's gain where its return had given it back (-Phi at the end): a trainer
    summing step rewards (the gymnasium env's, `gate serve`'s) paid 0.4 for an episode graded 0 that never reported."""
    from gate_pipeline.kernel.engine import Session
    case = read_cases(EVAL)[8]  # eval-amount-bounds-0: one bad orders batch, one clean
    bad = next(b.batch_id for b in case.batches if b.defective)
    good = next(b.batch_id for b in case.batches if not b.defective)
    s = Session(prepare(case), reward=mode, stop_at_report=True, max_steps=5)
    steps = [s.step(a) for a in (["read_contract", {}], ["profile_batch", {"batch_id": bad}],
                                 ["profile_batch", {"batch_id": good}],
                                 ["quarantine_batch", {"batch_id": bad, "column": "amount", "defect_type": "out_of_range"}],
                                 ["load_batch", {"batch_id": good}])]
    assert steps[-1].truncated and not steps[-1].terminated and steps[-1].grade.reward == 0.0
    assert [st.reward for st in steps] == s.rewards
    assert abs(sum(st.reward for st in steps) - s.result.total_reward) < 1e-12
    if mode == "potential":
        assert abs(s.result.total_reward + s.shaper.start) < 1e-9  # -Phi(s0): nothing paid for what it did
