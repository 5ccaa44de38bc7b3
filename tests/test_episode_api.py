"""The episode API: reset/step, both reward modes, max_turns, malformed actions, replay_dense, the CLI."""
from __future__ import annotations

import json

import pytest

from gate_pipeline.agents import BASELINES, make_agent
from gate_pipeline.cases import read_cases
from gate_pipeline.cli.main import main
from gate_pipeline.episode_api import GateEnv, replay_dense, run_agent
from gate_pipeline.runner import play, replay
from gate_pipeline.tools import DECISIONS, TOOL_NAMES
from gate_pipeline.world import PreparedCase

EVAL = "cases/classic/eval_curated.jsonl"
CASES = read_cases(EVAL)


@pytest.fixture(scope="module")
def dense_env():
    env = GateEnv(EVAL, reward="dense")
    yield env
    env.close()


def recorded(env, agent, case_id):
    """Play an agent in env, recording every (action, reward, info)."""
    env.reset(options={"case_id": case_id})
    steps = []

    def tools(name, **args):
        obs, reward, term, trunc, info = env.step({"tool": name, "args": args})
        steps.append(({"tool": name, "args": args}, reward, term, trunc, info))
        return obs["result"]

    agent.play(tools)
    return steps


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_terminal_mode_final_reward_is_the_core_grade(name):
    env = GateEnv(CASES, reward="terminal")
    for case in CASES:
        steps = recorded(env, make_agent(name), case["case_id"])
        want = play(PreparedCase(case), make_agent(name))["reward"]
        *before, last = steps
        assert last[2] is True and last[1] == want, case["case_id"]
        assert last[4]["grade"]["reward"] == want
        assert all(s[1] == 0.0 and not s[2] and not s[3] for s in before)
        assert env.episode.ledger.intact()
    env.close()


def test_dense_mode_pays_decisions_nothing_and_the_rubric_at_the_report(dense_env):
    for case in CASES:
        for name in ("careful-sql", "careful", "naive", "refuse-all"):
            steps = recorded(dense_env, make_agent(name), case["case_id"])
            for action, reward, term, _, info in steps:
                if action["tool"] in DECISIONS:
                    assert reward == 0.0 and info["layer1"] == 0.0 and info["layer2"] == 0.0
            action, reward, term, _, info = steps[-1]
            assert action["tool"] == "submit_report" and term
            assert info["layer3"] == info["grade"]["reward"]
            assert reward == info["step_reward"] + info["layer3"]
            shaped = sum(s[4]["step_reward"] for s in steps)
            assert shaped == pytest.approx(dense_env.ctx.cumulative_step_reward, abs=1e-9)


def test_careful_sql_finds_the_gold_rows_progress(dense_env):
    paid = []
    for case in CASES:
        steps = recorded(dense_env, make_agent("careful-sql"), case["case_id"])
        paid.append(sum(s[4]["layer2"] for s in steps))
        assert paid[-1] <= 0.15 + 1e-12
        if not any(b["truth"]["defective"] for b in case["batches"]):
            assert paid[-1] == 0.0
    assert sum(p > 0 for p in paid) >= len(CASES) // 2


def test_reset_by_case_id_seed_and_sequence():
    env = GateEnv(EVAL)
    obs, info = env.reset(options={"case_id": CASES[5]["case_id"]})
    assert info["case_id"] == CASES[5]["case_id"]
    assert obs["prompt"] == CASES[5]["prompt"] and set(obs["tools"]) == set(TOOL_NAMES) and obs["turn"] == 0
    assert env.reset(seed=3)[1]["case_id"] == CASES[3]["case_id"]
    assert env.reset(3 + len(CASES))[1]["case_id"] == CASES[3]["case_id"]  # positional, as the brief writes it
    assert env.reset()[1]["case_id"] == CASES[4]["case_id"]  # no seed: the next case
    for bad in ({"options": {"case_id": "nope"}}, {"options": {"case": 1}}, {"options": "x"},
                {"seed": -1}, {"seed": "1"}, {"seed": True}):
        with pytest.raises(ValueError):
            env.reset(**bad)
    env.close()


def test_bad_constructor_arguments_are_clear_errors():
    for kwargs in ({"reward": "shaped"}, {"max_turns": 0}, {"max_turns": "5"}, {"cases": []}):
        with pytest.raises(ValueError):
            GateEnv(EVAL if "cases" not in kwargs else kwargs.pop("cases"), **kwargs)


MALFORMED = [None, 5, "run_sql", [1, 2, 3], {"args": {}}, {"tool": 3}, {"tool": ["x"], "args": {}},
             ("run_sql",), ("run_sql", {"query": 5}), {"tool": "run_sql", "args": "SELECT 1"},
             {"tool": "load_batch", "args": {"batch_id": 1}}, {"tool": "drop_table", "args": {1: 2, "a": 3}},
             {"tool": "run_sql", "args": {"query": "DELETE FROM wh_orders"}},
             {"tool": "submit_report", "args": {"loaded": "all", "quarantined": []}}]


@pytest.mark.parametrize("mode", ["terminal", "dense"])
def test_malformed_actions_give_error_observations_and_never_raise(mode):
    env = GateEnv(EVAL, reward=mode)
    obs, reward, term, trunc, info = env.step({"tool": "list_batches"})
    assert "error" in obs["result"] and reward == 0.0  # before reset
    env.reset(seed=1)
    mart = env.episode.world.revenue()
    for action in MALFORMED:
        obs, reward, term, trunc, info = env.step(action)
        assert "error" in obs["result"], action
        assert not term and not trunc
        assert reward <= 0.0
    assert env.episode.world.revenue() == mart and env.episode.ledger.intact()
    assert len(env.episode.ledger.entries) == len(MALFORMED)  # every refused call is on the ledger
    env.close()


def test_tuple_actions_work_like_dicts(dense_env):
    dense_env.reset(seed=0)
    obs, reward, *_ = dense_env.step(("run_sql", {"query": "SELECT 1"}))
    assert obs["result"]["rows"] == [[1]] and reward == 0.025


def test_vectors_through_the_real_tools(dense_env):
    dense_env.reset(options={"case_id": "eval-amount-bounds-0"})
    gold = dense_env.ctx.gold_rows
    assert len(gold) == 1 and float(gold[0][2]) > 50000
    _, reward, *_ = dense_env.step(("run_sql", {"query": "SELEC 1"}))
    assert reward == -0.005
    obs, reward, _, _, info = dense_env.step(
        ("run_sql", {"query": "SELECT * FROM stg_b_0930_70_1 WHERE CAST(amount AS REAL) > 50000"}))
    assert [tuple(r) for r in obs["result"]["rows"]] == gold
    assert info["layer1"] == 0.025 and info["layer2"] == 0.15
    _, reward, *_ = dense_env.step(("run_sql", {"query": " SELECT * FROM stg_b_0930_70_1\nWHERE CAST(amount AS REAL) > 50000;"}))
    assert reward == pytest.approx(-0.015, abs=1e-12)


def test_max_turns_truncates_with_terminal_zero():
    env = GateEnv(EVAL, reward="dense", max_turns=3)
    env.reset(seed=0)
    out = [env.step({"tool": "run_sql", "args": {"query": f"SELECT {i}"}}) for i in range(3)]
    assert [o[3] for o in out] == [False, False, True] and not any(o[2] for o in out)
    assert out[-1][4]["layer3"] == 0.0 and out[-1][1] == out[-1][4]["step_reward"]
    obs, reward, term, trunc, info = env.step({"tool": "submit_report", "args": {"loaded": [], "quarantined": []}})
    assert "error" in obs["result"] and reward == 0.0
    assert env.episode.world.report is None  # the cut-off episode stays unreported
    env.close()


def test_after_the_report_the_episode_is_over():
    env = GateEnv(EVAL, reward="terminal")
    env.reset(seed=0)
    _, reward, term, *_ = env.step({"tool": "submit_report", "args": {"loaded": [], "quarantined": []}})
    assert term
    n = len(env.episode.ledger.entries)
    obs, reward, term, trunc, info = env.step({"tool": "load_batch", "args": {"batch_id": "x"}})
    assert "error" in obs["result"] and reward == 0.0 and term
    assert len(env.episode.ledger.entries) == n
    env.close()


def test_replay_dense_matches_core_replay_and_the_env():
    env = GateEnv(CASES, reward="dense")
    for case in CASES[::3]:
        steps = recorded(env, make_agent("careful-sql"), case["case_id"])
        calls = [s[0] for s in steps] + [{"tool": "load_batch", "args": {"batch_id": "x"}},
                                         {"tool": "run_sql", "args": {"query": "SELECT 2"}}]
        prepared = PreparedCase(case)
        out = replay_dense(prepared, calls)
        core = replay(prepared, calls)
        for key in ("results", "ledger", "grade", "revenue"):
            assert out[key] == core[key]
        assert len(out["rewards"]) == len(calls)
        assert out["rewards"][:len(steps)] == [s[1] for s in steps]  # same rewards as the env gave
        assert out["rewards"][len(steps):] == [0.0, 0.0]              # after the report: nothing
        assert out["rewards"][len(steps) - 1] == core["grade"]["reward"]
        assert out["dense_return"] == sum(out["rewards"])
    env.close()


def test_replay_dense_without_report_has_no_terminal_reward():
    calls = [{"tool": "run_sql", "args": {"query": "SELECT 1"}}, {"tool": "load_batch", "args": {"batch_id": "B-x"}},
             {"tool": "run_sql", "args": {"query": "SELECT 1"}}, "junk"]
    out = replay_dense(PreparedCase(CASES[0]), calls)
    assert out["rewards"][:3] == pytest.approx([0.025, 0.0, -0.015], abs=1e-12)
    assert out["rewards"][3] == pytest.approx(-0.005, abs=1e-12)
    assert out["grade"]["reward"] == 0.0


def test_random_policy_is_seeded():
    def ledger(seed):
        env = GateEnv(CASES[:4], reward="dense")
        agent = make_agent("random", seed=seed)
        calls = []
        for case in CASES[:4]:
            run_agent(env, agent, case["case_id"])
            calls.append([(e["action"], e["args"]) for e in env.episode.ledger.entries])
        return calls

    assert ledger(1) == ledger(1)
    assert ledger(1) != ledger(2)
    tools = {a for episode in ledger(3) for a, _ in episode}
    assert {"list_batches", "submit_report"} <= tools and len(tools) >= 4


def test_cli_replay_reward_dense(tmp_path, capsys):
    case = CASES[8]
    env = GateEnv(CASES, reward="dense")
    steps = recorded(env, make_agent("careful"), case["case_id"])
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"case_id": case["case_id"], "calls": [s[0] for s in steps]}) + "\n")
    assert main(["replay", "--cases", EVAL, "--trajectories", str(traj), "--json", "--reward", "dense"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["rewards"] == [s[1] for s in steps]
    assert line["dense_return"] == pytest.approx(sum(s[1] for s in steps))


def test_cli_dense_report_careful_far_above_random(capsys):
    assert main(["report", "--reward", "dense", "--cases", EVAL, "--json", "--seed", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    policies = out["policies"]
    assert list(policies) == ["random", "naive", "careful-sql", "careful"] and out["cases"] == len(CASES)
    for name in ("careful-sql", "careful"):
        assert policies[name]["return"]["mean"] > policies["random"]["return"]["mean"] + 0.5
        assert policies[name]["terminal"]["min"] == 1.0
    for p in policies.values():
        assert p["return"]["mean"] == pytest.approx(p["step"]["mean"] + p["terminal"]["mean"])
        assert p["step"]["max"] <= 0.5 and p["step"]["min"] >= -0.2
    assert main(["report", "--reward", "dense", "--cases", EVAL]) == 0
    text = capsys.readouterr().out
    assert "careful - random:" in text and "terminal" in text


def test_gymnasium_registration():
    gymnasium = pytest.importorskip("gymnasium")
    env = gymnasium.make("gate/Gate-v0", cases=EVAL, reward="dense")
    obs, info = env.reset(seed=2)
    assert info["case_id"] == CASES[2]["case_id"]
    obs, reward, term, trunc, info = env.step({"tool": "run_sql", "args": {"query": "SELECT 1"}})
    assert reward == 0.025 and not term and not trunc
    env.close()
