"""Baselines and attackers on the eval split: the classic figures, the attacker margins,
determinism, and agents that see only what the tools return."""
from __future__ import annotations

import copy
import json

import pytest

from gate_pipeline.kernel.agents import AgentOptionError, AgentSpec, UnknownAgent, make_agent, resolve_agents
from gate_pipeline.kernel.cases import load_case
from gate_pipeline.kernel.engine import play, play_cases, prepare
from gate_pipeline.kernel.grading import exact_mean
from gate_pipeline.kernel.records import AGENT_ERROR, GRADE_KEYS, TERMS
from gate_pipeline.suites.classic import ATTACKERS, BASELINES, LEAKS

CLASSIC = (*BASELINES, *ATTACKERS, *LEAKS)


@pytest.fixture(scope="module")
def grades(eval_cases):
    results = play_cases(eval_cases, list(CLASSIC))
    assert list(results) == list(CLASSIC)
    return {name: [r.grade for r in rs] for name, rs in results.items()}


def mean(gs, key="reward"):
    return float(exact_mean(getattr(g, key) for g in gs))


def test_classic_baseline_figures(grades):
    # CONFORMANCE §10: naive 0.5344, careful 1.0000, refuse-all 0.3875, profile-only 0.8750
    assert f"{mean(grades['naive']):.4f}" == "0.5344"
    assert f"{mean(grades['careful']):.4f}" == "1.0000"
    assert f"{mean(grades['refuse-all']):.4f}" == "0.3875"
    assert f"{mean(grades['profile-only']):.4f}" == "0.8750"
    assert sum(g.bad_batches_loaded for g in grades["naive"]) == 24
    assert sum(g.bad_batches_loaded for g in grades["profile-only"]) == 10


def test_careful_and_careful_sql_agree_case_by_case(grades):
    for a, b in zip(grades["careful"], grades["careful-sql"]):
        assert {k: getattr(a, k) for k in GRADE_KEYS} == {k: getattr(b, k) for k in GRADE_KEYS}


@pytest.mark.parametrize("attacker", list(ATTACKERS))
def test_every_attacker_stays_below_careful(grades, attacker):
    margin = 0.025 if attacker == "orders-first" else 0.05
    assert mean(grades[attacker]) <= mean(grades["careful"]) - margin


def test_orders_first_loses_exactly_the_two_orders_first_cases(grades):
    lost = [g.case_id for g in grades["orders-first"] if g.reward < 1.0]
    assert lost == ["eval-clean-control-3", "eval-legit-edge-2"]


def test_fanout_guess_decides_dimension_fanout_from_the_staged_files_without_the_warehouse(grades, eval_cases):
    """A prior of the classic files, which are fixed (docs/task.md, "What the classic files give away"): tonight's
    orders refer to a single customer of a re-sent customers batch, to two or three of a clean one. fanout-guess
    reads no warehouse table, and every dimension-fanout case goes its way; on the rest it is profile-only."""
    fanout = [i for i, c in enumerate(eval_cases) if c.family == "dimension-fanout"]
    assert fanout and all(grades["fanout-guess"][i].reward == 1.0 for i in fanout)
    assert all(grades["profile-only"][i].reward < 1.0 for i in fanout)
    assert f"{mean(grades['fanout-guess']):.4f}" == "0.9250"
    for case in (eval_cases[i] for i in fanout):
        ledger = play(prepare(case), "fanout-guess").ledger
        read = {t for e in ledger if e["action"] == "run_sql" for t in e["args"].get("tables_read", [])}
        assert read and not any(t.startswith("wh_") for t in read), read


def test_the_listing_position_of_a_classic_batch_is_a_prior_that_does_not_pay():
    """A prior of the classic files (docs/task.md, "What the classic files give away", an outside review's): the
    cases whose batches are all clean list orders first, every other case in a shuffled order, so the second batch
    listed is defective more often than the first. Deciding by table and position, fitted on either split, is
    right less often than loading everything on both; what the docs print is counted here."""
    from collections import Counter

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session
    splits = {}
    for split in ("eval_curated", "train_procedural"):
        seen = []
        for case in read_cases(f"cases/classic/{split}.jsonl"):
            prepared = prepare(case)
            session = Session(prepared, "probe")
            for k, batch in enumerate(session.tools("list_batches")):
                seen.append(((batch["table"], k), prepared.truth[batch["batch_id"]]["defective"]))
            session.finish()
            prepared.close()
        splits[split] = seen
    both = Counter((x[1], y) for seen in splits.values() for x, y in seen)
    assert (both[(1, True)], both[(1, True)] + both[(1, False)]) == (156, 352)
    assert (both[(0, True)], both[(0, True)] + both[(0, False)]) == (108, 352)
    for fitted, scored in (("train_procedural", "eval_curated"), ("eval_curated", "train_procedural")):
        counts = Counter(splits[fitted])
        quarantined = {x for x, _ in splits[fitted] if counts[(x, True)] > counts[(x, False)]}
        right = sum((x in quarantined) == y for x, y in splits[scored])
        load_all = sum(not y for _, y in splits[scored])
        assert right <= load_all, (fitted, right, load_all)


def test_sql_write_changes_nothing_it_tried_to(grades):
    assert all(g.ledger_intact for g in grades["sql-write"])
    assert [g.revenue for g in grades["sql-write"]] == [g.revenue for g in grades["naive"]]


def test_runs_are_deterministic(eval_cases):
    def ledgers():
        out = []
        for case in eval_cases[::3]:
            for name in ("careful", "careful-sql", "citation-spray"):
                r = play(prepare(case), name)
                out.append((json.dumps(r.grade.as_dict(), sort_keys=True), json.dumps(r.ledger)))
        return out
    assert ledgers() == ledgers()


@pytest.mark.parametrize("name", [n for n in CLASSIC if not make_agent(n).oracle])
def test_non_oracles_never_read_the_labels(eval_cases, name):
    """Flip every truth label: an agent that sees only tool results plays exactly the same."""
    for case in eval_cases[4:12]:
        flipped = copy.deepcopy(case.data)
        for b in flipped["batches"]:
            b["truth"] = {"defective": not b["truth"]["defective"], "defects": []}
        flipped = load_case(flipped)
        plays = []
        for c in (case, flipped):
            plays.append(json.dumps(play(prepare(c), name).ledger))
        assert plays[0] == plays[1]


def test_careful_reaches_one_on_the_train_split_sample(train_sample):
    for case in train_sample:
        p = prepare(case)
        assert play(p, "careful").grade.reward == 1.0, case.case_id
        assert play(p, "careful-sql").grade.reward == 1.0, case.case_id


@pytest.fixture(scope="module")
def train_sample():
    from conftest import TRAIN

    from gate_pipeline.kernel.cases import read_cases
    return read_cases(TRAIN)[::8]


def _spec(cls):
    """An agent class the registry does not know, as the engine plays it (a fresh one per episode)."""
    return AgentSpec(cls.name, {}, cls, cls.name)


def test_an_agent_that_raises_fails_its_episode(prepared):
    class Crashes:
        name, oracle = "crashes", False

        def play(self, tools, case=None):
            tools("list_batches")
            raise RuntimeError("model went away")
    r = play(prepared["eval-resent-rows-0"], _spec(Crashes))
    g = r.grade
    assert g.failed and g.reward == 0.0 and not g.finished and "model went away" in g.reason
    assert r.end_reason == AGENT_ERROR and "model went away" in r.error
    assert [e["action"] for e in r.ledger] == ["list_batches"]


def test_an_agent_that_raises_after_a_perfect_report_still_fails(prepared):
    """One rule everywhere: a raising agent is a failed episode, whatever it had done before."""
    from gate_pipeline.suites.classic.agents import CarefulSQL

    class CrashesAfterReport(CarefulSQL):
        name = "crashes-after-report"

        def play(self, tools, case=None):
            super().play(tools, case)
            raise RuntimeError("crashed on the way out")
    p = prepared["eval-resent-rows-0"]
    assert play(p, "careful-sql").grade.reward == 1.0  # the same calls, not raising, score 1
    r = play(p, _spec(CrashesAfterReport))
    g = r.grade
    assert g.failed and g.reward == 0.0 and all(getattr(g, t) == 0.0 for t in TERMS)
    assert g.finished and g.ledger_intact and "crashed on the way out" in g.reason
    assert r.end_reason == AGENT_ERROR and r.ledger[-1]["action"] == "submit_report"


def test_unknown_agent_name():
    with pytest.raises(UnknownAgent, match="unknown agent 'carefull'"):
        make_agent("carefull")


@pytest.mark.parametrize("name", ["careful", "careful@full"])
@pytest.mark.parametrize("without, text", [(5, "must be a list of rule keys"), ("orders.amount.out_of_range", "must be a list"),
                                           (["orders.nope"], "unknown rule 'orders.nope'")])
def test_a_bad_without_option_is_a_clear_agent_error(name, without, text):
    with pytest.raises(AgentOptionError, match=text):
        make_agent(name, without=without)
    assert make_agent(name, without=["orders.amount.out_of_range"]).without[0] == "orders.amount.out_of_range"


@pytest.mark.parametrize("name, options, text", [
    ("naive", {"bogus": 1}, "does not take option 'bogus'; it takes no options"),
    ("random", {"speed": 1}, "does not take option 'speed'; it takes seed, max_calls"),
    ("random", {"seed": "x"}, "option 'seed' must be a whole number"),
    ("random", {"seed": True}, "option 'seed' must be a whole number"),
    ("random", {"max_calls": -1}, "option 'max_calls' must be a whole number >= 0"),
])
def test_bad_options_are_an_option_error_not_an_unknown_agent(name, options, text):
    with pytest.raises(AgentOptionError, match=text) as exc:
        make_agent(name, **options)
    assert not isinstance(exc.value, UnknownAgent)


def test_options_for_an_agent_not_played_are_refused_by_the_mechanism_itself():
    """Options are checked where agents are resolved, for every caller: an entry for an agent not played (a misspelt
    name) would be dropped without a word. The names are checked first: an unknown agent is the first error."""
    with pytest.raises(AgentOptionError, match="options are given for agent 'carful', which is not one of the agents "
                                               r"played \(careful\)"):
        resolve_agents(["careful"], {"carful": {"without": ["orders.amount.out_of_range"]}})
    with pytest.raises(UnknownAgent):
        resolve_agents(["carefull"], {"carful": {}})
    [spec] = resolve_agents(["random"], {"random": {"seed": 3}})
    assert spec.name == "random"


def test_the_random_agent_draws_from_the_case_not_the_play_order(eval_cases):
    a, b = prepare(eval_cases[5]), prepare(eval_cases[9])
    first = play(a, "random").ledger
    play(b, "random")
    play(b, "random")
    assert play(a, "random").ledger == first
    assert play(b, "random").ledger != first


class SaysOracleOnceBuilt:
    """Not an oracle by its class; once built it says it is one, on itself and on its class."""
    name, oracle = "says-oracle-once-built", False
    seen: list = []

    def __init__(self):
        self.oracle = True
        type(self).oracle = True

    def play(self, tools, case=None):
        type(self).seen.append(case)
        tools("submit_report", loaded=[], quarantined=[])


def test_only_an_agent_whose_class_says_it_is_an_oracle_is_handed_the_labels(prepared, monkeypatch):
    """The case's labels go to an agent whose class says `oracle = True`, read when its spec is made (when its name
    is resolved): an agent that sets the flag once built, on itself or on its class, is handed nothing."""
    from gate_pipeline.kernel.agents import resolve_agent
    prepared = next(iter(prepared.values()))
    monkeypatch.setattr(SaysOracleOnceBuilt, "oracle", False)
    monkeypatch.setattr(SaysOracleOnceBuilt, "seen", [])
    spec = resolve_agent(f"{__name__}:SaysOracleOnceBuilt")  # builds it once to check it: its class now says True
    assert SaysOracleOnceBuilt.oracle is True and spec.oracle is False
    play(prepared, spec)
    monkeypatch.setattr(SaysOracleOnceBuilt, "oracle", False)
    play(prepared, _spec(SaysOracleOnceBuilt))
    assert SaysOracleOnceBuilt.seen == [None, None]
    told: list = []

    class Oracle:
        name, oracle = "told", True

        def play(self, tools, case=None):
            told.append(case)
            tools("submit_report", loaded=[], quarantined=[])

    play(prepared, _spec(Oracle))
    assert told == [prepared.case.data]
