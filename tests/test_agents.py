"""Baselines and attackers on the eval split: the classic figures, the attacker margins,
determinism, and agents that see only what the tools return."""
from __future__ import annotations

import copy
import json

import pytest

from gate_pipeline.agents import ATTACKERS, BASELINES, UnknownAgent, make_agent
from gate_pipeline.grader import GRADE_KEYS, exact_mean
from gate_pipeline.runner import play, play_agents
from gate_pipeline.world import PreparedCase


CLASSIC = {**BASELINES, **ATTACKERS}


@pytest.fixture(scope="module")
def grades(eval_cases):
    return play_agents(eval_cases, list(CLASSIC))


def mean(gs, key="reward"):
    return float(exact_mean(g[key] for g in gs))


def test_classic_baseline_figures(grades):
    # CONFORMANCE §10: naive 0.5344, careful 1.0000, refuse-all 0.3875, profile-only 0.8750
    assert f"{mean(grades['naive']):.4f}" == "0.5344"
    assert f"{mean(grades['careful']):.4f}" == "1.0000"
    assert f"{mean(grades['refuse-all']):.4f}" == "0.3875"
    assert f"{mean(grades['profile-only']):.4f}" == "0.8750"
    assert sum(g["bad_batches_loaded"] for g in grades["naive"]) == 24
    assert sum(g["bad_batches_loaded"] for g in grades["profile-only"]) == 10


def test_careful_and_careful_sql_agree_case_by_case(grades):
    for a, b in zip(grades["careful"], grades["careful-sql"]):
        assert {k: a[k] for k in GRADE_KEYS} == {k: b[k] for k in GRADE_KEYS}


@pytest.mark.parametrize("attacker", list(ATTACKERS))
def test_every_attacker_stays_below_careful(grades, attacker):
    margin = 0.025 if attacker == "orders-first" else 0.05
    assert mean(grades[attacker]) <= mean(grades["careful"]) - margin


def test_orders_first_loses_exactly_the_two_orders_first_cases(grades):
    lost = [g["case_id"] for g in grades["orders-first"] if g["reward"] < 1.0]
    assert lost == ["eval-clean-control-3", "eval-legit-edge-2"]


def test_sql_write_changes_nothing_it_tried_to(grades):
    assert all(g["ledger_intact"] for g in grades["sql-write"])
    assert [g["revenue"] for g in grades["sql-write"]] == [g["revenue"] for g in grades["naive"]]


def test_runs_are_deterministic(eval_cases):
    def ledgers():
        out = []
        for case in eval_cases[::3]:
            for name in ("careful", "careful-sql", "citation-spray"):
                g, ep = play(PreparedCase(case), make_agent(name), keep_episode=True)
                out.append((json.dumps(g, sort_keys=True), json.dumps(ep.ledger.entries)))
                ep.close()
        return out
    assert ledgers() == ledgers()


@pytest.mark.parametrize("name", [n for n, cls in CLASSIC.items() if not cls.oracle])
def test_non_oracles_never_read_the_labels(eval_cases, name):
    """Flip every truth label: an agent that sees only tool results plays exactly the same."""
    for case in eval_cases[4:12]:
        flipped = copy.deepcopy(case)
        for b in flipped["batches"]:
            b["truth"] = {"defective": not b["truth"]["defective"], "defects": []}
        plays = []
        for c in (case, flipped):
            _, ep = play(PreparedCase(c), make_agent(name), keep_episode=True)
            plays.append(json.dumps(ep.ledger.entries))
            ep.close()
        assert plays[0] == plays[1]


def test_careful_reaches_one_on_the_train_split_sample(train_sample):
    for case in train_sample:
        p = PreparedCase(case)
        assert play(p, make_agent("careful"))["reward"] == 1.0, case["case_id"]
        assert play(p, make_agent("careful-sql"))["reward"] == 1.0, case["case_id"]


@pytest.fixture(scope="module")
def train_sample():
    from gate_pipeline.cases import read_cases
    from conftest import TRAIN
    return read_cases(TRAIN)[::8]


def test_an_agent_that_raises_is_graded_as_it_stands(prepared):
    class Crashes:
        name, oracle = "crashes", False

        def play(self, tools, case=None):
            tools("list_batches")
            raise RuntimeError("model went away")
    g = play(prepared["eval-resent-rows-0"], Crashes())
    assert g["reward"] == 0.0 and not g["finished"] and "model went away" in g["error"]


def test_unknown_agent_name():
    with pytest.raises(UnknownAgent, match="unknown agent 'carefull'"):
        make_agent("carefull")


@pytest.mark.parametrize("name", ["careful", "careful@full"])
@pytest.mark.parametrize("without, text", [(5, "must be a list of rule keys"), ("orders.amount.out_of_range", "must be a list"),
                                           (["orders.nope"], "unknown rule 'orders.nope'")])
def test_a_bad_without_option_is_a_clear_agent_error(name, without, text):
    with pytest.raises(UnknownAgent, match=text):
        make_agent(name, without=without)
    assert make_agent(name, without=["orders.amount.out_of_range"]).without[0] == "orders.amount.out_of_range"
