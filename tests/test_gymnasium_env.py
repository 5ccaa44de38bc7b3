"""gate as a gymnasium env over the one engine: reset/step, text observations, both reward modes,
max_turns, malformed actions, replay in dense mode, the CLI's dense commands, registration."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import gymnasium
import numpy as np
import pytest
from conftest import EVAL, TRAIN
from gymnasium.utils.seeding import np_random

from gate_pipeline.cli.main import main
from gate_pipeline.integrations.gymnasium_env import GateEnv
from gate_pipeline.kernel import engine
from gate_pipeline.kernel.actions import parse_action
from gate_pipeline.kernel.agents import make_agent, resolve_agent
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import prepare
from gate_pipeline.kernel.ledger import chain_intact
from gate_pipeline.suites.classic import BASELINES
from gate_pipeline.suites.classic.tools import TOOL_NAMES, TOOLS

CASES = read_cases(EVAL)
# the decisions on a batch (loads and quarantines): unshaped tools, the report apart
DECISIONS = tuple(t.name for t in TOOLS if t.shaped is None and t.name != "submit_report")


@dataclass
class Recorded:
    action: object
    reward: float
    terminated: bool
    truncated: bool
    info: dict
    obs: dict


class EnvTools:
    """What an agent gets (`tools(name, **args)`, `tools.act`, `tools.episode_seed`), over env.step."""

    def __init__(self, env, steps: list, as_text: bool = False):
        self.env, self.steps, self.as_text = env, steps, as_text

    @property
    def episode_seed(self) -> int:
        return self.env.unwrapped.session.episode_seed

    @property
    def suite(self):
        return self.env.unwrapped.session.prepared.suite

    def __call__(self, name, **args):
        return self.act({"tool": name, "args": args})

    def act(self, action):
        if self.as_text:
            action = json.dumps(action)
        obs, reward, term, trunc, info = self.env.step(action)
        self.steps.append(Recorded(action, reward, term, trunc, info, obs))
        return json.loads(info["result"])


def recorded(env, agent_name, case_id, as_text=False) -> list[Recorded]:
    """Play an agent through the env on one case, recording every step."""
    env.reset(options={"case_id": case_id})
    steps: list[Recorded] = []
    make_agent(agent_name).play(EnvTools(env, steps, as_text))
    return steps


@pytest.fixture(scope="module")
def dense_env():
    env = GateEnv(EVAL, reward="dense")
    yield env
    env.close()


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_terminal_mode_final_reward_is_the_core_grade(name):
    env = GateEnv(CASES, reward="terminal")
    for case in CASES:
        steps = recorded(env, name, case.case_id)
        want = engine.play(prepare(case), name).grade.reward
        *before, last = steps
        assert last.terminated is True and last.reward == want, case.case_id
        assert json.loads(last.info["grade"])["reward"] == want and json.loads(last.info["result"]) == {"status": "received"}
        assert all(s.reward == 0.0 and not s.terminated and not s.truncated for s in before)
        assert env.session.done and chain_intact(env.session.result.ledger)
        assert env.session.result.rewards == [s.reward for s in steps]
    env.close()


def test_observations_are_text_the_raw_result_is_in_info(dense_env):
    steps = recorded(dense_env, "careful-sql", CASES[3].case_id)
    for s in steps:
        assert set(s.obs) == {"prompt", "result", "turn"}
        assert s.obs["prompt"] == CASES[3].prompt and s.obs["turn"] == s.info["turn"]
        assert s.obs["result"] == json.dumps(json.loads(s.info["result"]), ensure_ascii=True, default=str)
        assert dense_env.observation_space.contains(s.obs), s.obs["result"][:200]
    assert [s.obs["turn"] for s in steps] == list(range(1, len(steps) + 1))


def test_dense_mode_pays_decisions_nothing_and_the_rubric_at_the_report(dense_env):
    for case in CASES:
        for name in ("careful-sql", "careful", "naive", "refuse-all"):
            steps = recorded(dense_env, name, case.case_id)
            for s in steps:
                assert "step" not in s.info  # the step's reward is `step_reward`, beside its layers
                if s.action["tool"] in DECISIONS + ("submit_report",):  # not shaped: no layers, no step reward
                    assert "layer1" not in s.info and "step_reward" not in s.info
                else:
                    assert {"layer1", "layer2", "step_reward"} <= set(s.info)
                if s.action["tool"] in DECISIONS:
                    assert s.reward == 0.0
                else:
                    assert s.action["tool"] == "submit_report" or s.reward == s.info["step_reward"]
            last = steps[-1]
            assert last.action["tool"] == "submit_report" and last.terminated
            assert last.reward == json.loads(last.info["grade"])["reward"]  # the report's step pays the rubric only
            shaped = sum(s.info.get("step_reward", 0.0) for s in steps)
            session = dense_env.unwrapped.session
            assert shaped == pytest.approx(session.shaper.ctx.cumulative_step_reward, abs=1e-9)
            assert session.result.total_reward == pytest.approx(shaped + json.loads(last.info["grade"])["reward"], abs=1e-9)


def test_careful_sql_finds_the_gold_rows_progress(dense_env):
    paid = []
    for case in CASES:
        steps = recorded(dense_env, "careful-sql", case.case_id)
        paid.append(sum(s.info.get("layer2", 0.0) for s in steps))
        assert paid[-1] <= 0.15 + 1e-12
        if not any(b.defective for b in case.batches):
            assert paid[-1] == 0.0
    assert sum(p > 0 for p in paid) >= len(CASES) // 2


def test_reset_by_case_id_and_by_the_seeded_generator():
    env = GateEnv(EVAL)
    obs, info = env.reset(options={"case_id": CASES[5].case_id})
    assert info["case_id"] == CASES[5].case_id and set(json.loads(info["tools"])) == set(TOOL_NAMES)
    assert obs == {"prompt": CASES[5].prompt, "result": "", "turn": 0}
    assert env.observation_space.contains(obs)
    # the seed seeds the env's generator, which draws the case (not seed % number of cases)
    rng = np_random(3)[0]
    first, second = (CASES[int(rng.integers(len(CASES)))].case_id for _ in range(2))
    assert env.reset(seed=3)[1]["case_id"] == first
    assert env.reset()[1]["case_id"] == second  # no seed: the generator goes on
    assert env.reset(seed=3)[1]["case_id"] == first  # the same seed, the same case
    later = CASES[int(np_random(3 + len(CASES))[0].integers(len(CASES)))].case_id
    assert env.reset(seed=3 + len(CASES))[1]["case_id"] == later
    assert len({env.reset(seed=s)[1]["case_id"] for s in range(40)}) > 10
    for bad in ({"case_id": "nope"}, {"case": 1}, "x", ["case_id"]):
        with pytest.raises(ValueError):
            env.reset(options=bad)
    for bad in (-1, "1", 1.5):
        with pytest.raises(gymnasium.error.Error):
            env.reset(seed=bad)
    env.close()


def test_the_default_cases_are_the_classic_train_split():
    env = GateEnv()
    assert [c.case_id for c in env.cases] == [c.case_id for c in read_cases(TRAIN)]
    env.close()


def test_bad_constructor_arguments_are_clear_errors():
    for kwargs in ({"reward": "shaped"}, {"max_turns": 0}, {"max_turns": "5"}, {"max_turns": True},
                   {"cases": []}, {"cases": [CASES[0], CASES[0]]}, {"cases": "nope.jsonl"}):
        with pytest.raises(ValueError):
            GateEnv(**({"cases": EVAL} | kwargs))


MALFORMED = [None, 5, "run_sql", [1, 2, 3], {"args": {}}, {"tool": 3}, {"tool": ["x"], "args": {}},
             ("run_sql",), ("run_sql", {"query": 5}), {"tool": "run_sql", "args": "SELECT 1"},
             {"tool": "load_batch", "args": {"batch_id": 1}}, {"tool": "drop_table", "args": {1: 2, "a": 3}},
             {"tool": "run_sql", "args": {"query": "DELETE FROM wh_orders"}},
             {"tool": "submit_report", "args": {"loaded": "all", "quarantined": []}},
             '{"tool": "list_batches"', '"list_batches"', "[]", '{"tool": "list_batches", "argz": {}}',
             {"tool": "list_batches", "args": {}, "extra": 1}, ["run_sql", "[1, 2]"], object(), b"bytes",
             "[" * 100_000,
             # arrays (a vector env's actions): their == is element by element, not a truth value
             {"type": np.array(["function", "x"]), "function": {"name": "list_batches"}},
             {"tool": "list_batches", "args": np.array([1, 2])}, ["profile_batch", np.array([1, 2])]]


@pytest.mark.parametrize("mode", ["terminal", "dense"])
def test_malformed_actions_give_error_observations_and_never_raise(mode):
    env = GateEnv(EVAL, reward=mode)
    obs, reward, term, trunc, info = env.step({"tool": "list_batches"})
    assert "error" in json.loads(obs["result"]) and reward == 0.0 and not term  # before reset
    env.reset(seed=1)
    episode = env.session.episode
    mart = episode.world.revenue()
    for action in MALFORMED:
        obs, reward, term, trunc, info = env.step(action)
        assert "error" in json.loads(obs["result"]) and "error" in json.loads(info["result"]), action
        assert not term and not trunc
        assert reward <= 0.0
    assert episode.world.revenue() == mart and chain_intact(episode.ledger.seal())
    entries = episode.ledger.entries
    assert len(entries) == len(MALFORMED) and not any(e["executed"] for e in entries)  # every one is logged
    malformed = [e for e in entries if e["note"] == "malformed action"]
    assert len(malformed) == sum(1 for a in MALFORMED if parse_action(a).problem) >= 10
    env.close()


@pytest.mark.parametrize("mode,layers", [("dense", ["layer1", "layer2"]), ("potential", ["potential"])])
def test_a_shaped_steps_info_is_its_own_keys_then_the_layers_then_the_step_reward(mode, layers):
    """`info` of a shaped step: the env's own keys, the shaper's layers in its order, then `step_reward` (the
    step's reward, never under `step`); the Step's parts are left as the session gave them."""
    env = GateEnv(EVAL, reward=mode)
    env.reset(options={"case_id": CASES[1].case_id})
    for action in ({"tool": "list_batches"}, {"tool": "run_sql", "args": {"query": "SELECT 1"}}, "not json"):
        parts = []
        step = env.session.step

        def kept(a, _step=step, parts=parts):
            out = _step(a)
            parts.append((out.parts, dict(out.parts)))
            return out
        env.session.step = kept
        _, reward, _, _, info = env.step(action)
        env.session.step = step
        assert list(info) == ["case_id", "turn", "reward_mode", "result", *layers, "step_reward"]
        assert info["step_reward"] == reward
        (given, copy), = parts
        assert given == copy and "step" in given  # (parts is a dict the session made: untouched by the env)
    env.close()


def test_an_action_is_json_text_or_a_dict_or_a_list(dense_env):
    dense_env.reset(options={"case_id": "eval-clean-control-0"})  # no gold rows: Layer 1 only
    assert dense_env.session.shaper.ctx.gold_rows == []
    for action in ('{"tool": "run_sql", "args": {"query": "SELECT 1"}}', ("run_sql", {"query": "SELECT 2"}),
                   ["run_sql", {"query": "SELECT 3"}], {"tool": "run_sql", "args": '{"query": "SELECT 4"}'}):
        obs, reward, *_, info = dense_env.step(action)
        assert json.loads(obs["result"])["rows"] == json.loads(info["result"])["rows"] and len(json.loads(info["result"])["rows"]) == 1
        assert reward == pytest.approx(0.025, abs=1e-12)
    obs, reward, *_, info = dense_env.step('["list_batches"]')
    assert isinstance(json.loads(info["result"]), list) and reward == pytest.approx(0.025, abs=1e-12)
    obs, *_, info = dense_env.step({"tool": "run_sql", "args": {"query": "SELECT 'caf\u00e9 \u2603'"}})
    assert obs["result"].isascii() and json.loads(obs["result"]) == json.loads(info["result"])
    assert json.loads(info["result"])["rows"] == [["caf\u00e9 \u2603"]] and dense_env.observation_space.contains(obs)


def test_vectors_through_the_real_tools(dense_env):
    dense_env.reset(options={"case_id": "eval-amount-bounds-0"})
    gold = dense_env.prepared("eval-amount-bounds-0").gold_rows
    assert gold == dense_env.session.shaper.ctx.gold_rows
    assert len(gold) == 1 and float(gold[0][2]) > 50000
    _, reward, *_ = dense_env.step(("run_sql", {"query": "SELEC 1"}))
    assert reward == -0.005
    _, reward, _, _, info = dense_env.step(
        ("run_sql", {"query": "SELECT * FROM stg_b_0930_70_1 WHERE CAST(amount AS REAL) > 50000"}))
    assert [tuple(r) for r in json.loads(info["result"])["rows"]] == gold
    assert info["layer1"] == 0.025 and info["layer2"] == 0.15 and reward == pytest.approx(0.175, abs=1e-12)
    _, reward, *_ = dense_env.step(("run_sql", {"query": " SELECT * FROM stg_b_0930_70_1\nWHERE CAST(amount AS REAL) > 50000;"}))
    assert reward == pytest.approx(-0.015, abs=1e-12)


def test_max_turns_truncates_with_terminal_zero():
    env = GateEnv(EVAL, reward="dense", max_turns=3)
    env.reset(seed=0)
    out = [env.step({"tool": "run_sql", "args": {"query": f"SELECT {i}"}}) for i in range(3)]
    assert [o[3] for o in out] == [False, False, True] and not any(o[2] for o in out)
    assert out[-1][1] == out[-1][4]["step_reward"]  # no terminal reward: the episode was cut off
    grade = json.loads(out[-1][4]["grade"])
    assert grade["reward"] == 0.0 and not grade["finished"]
    obs, reward, term, trunc, info = env.step({"tool": "submit_report", "args": {"loaded": [], "quarantined": []}})
    assert "error" in json.loads(obs["result"]) and reward == 0.0
    assert trunc and not term  # a step after the cut-off says how the episode ended: truncated, not terminated
    result = env.session.result
    assert not result.grade.finished and len(result.ledger) == 3  # the cut-off episode stays unreported
    env.close()


def test_after_the_report_the_episode_is_over():
    env = GateEnv(EVAL, reward="terminal")
    env.reset(seed=0)
    _, reward, term, *_ = env.step({"tool": "submit_report", "args": {"loaded": [], "quarantined": []}})
    assert term
    n = len(env.session.result.ledger)
    obs, reward, term, trunc, info = env.step({"tool": "load_batch", "args": {"batch_id": "x"}})
    assert "error" in json.loads(obs["result"]) and reward == 0.0 and term
    assert len(env.session.result.ledger) == n == 1
    env.close()


def test_a_reset_mid_episode_ends_the_old_episode_failed():
    env = GateEnv(EVAL)
    env.reset(seed=0)
    env.step({"tool": "list_batches"})
    old = env.session
    env.reset(seed=0)
    assert old.done and old.result.grade.failed and old.result.grade.reward == 0.0
    assert "reset or closed" in old.result.error and env.session is not old and env.session.turn == 0
    env.close()


def test_dense_replay_matches_terminal_replay_and_the_env():
    env = GateEnv(CASES, reward="dense")
    for case in CASES[::3]:
        steps = recorded(env, "careful-sql", case.case_id)
        n = len(steps)
        calls = [s.action for s in steps] + [{"tool": "load_batch", "args": {"batch_id": "x"}},
                                             {"tool": "run_sql", "args": {"query": "SELECT 2"}}]
        prepared = prepare(case)
        results, dense = engine.replay(prepared, calls, reward="dense")
        core_results, core = engine.replay(prepared, calls)
        assert results == core_results and dense.ledger == core.ledger and dense.grade == core.grade
        assert results[:n] == [json.loads(s.info["result"]) for s in steps]
        assert len(dense.rewards) == len(calls)
        assert dense.rewards[:n] == [s.reward for s in steps]  # same rewards as the env gave
        assert dense.rewards[n:] == [0.0, 0.0]                  # after the report: nothing
        assert dense.rewards[n - 1] == core.grade.reward
        assert core.rewards == [0.0] * (n - 1) + [core.grade.reward, 0.0, 0.0]
        assert dense.total_reward == sum(dense.rewards) and core.total_reward == core.grade.reward
    env.close()


def test_dense_replay_without_report_has_no_terminal_reward():
    calls = [{"tool": "run_sql", "args": {"query": "SELECT 1"}}, {"tool": "load_batch", "args": {"batch_id": "B-x"}},
             {"tool": "run_sql", "args": {"query": "SELECT 1"}}, "junk"]
    results, out = engine.replay(prepare(CASES[0]), calls, reward="dense")
    assert out.rewards[:3] == pytest.approx([0.025, 0.0, -0.015], abs=1e-12)
    assert out.rewards[3] == pytest.approx(-0.005, abs=1e-12)
    assert out.grade.reward == 0.0 and not out.grade.finished and out.end_reason == "no_report"
    assert "error" in results[3] and out.ledger[3]["note"] == "malformed action"


def test_random_policy_is_seeded_by_its_seed_and_the_case_never_by_play_order(dense_env):
    def ledgers(seed, cases):
        spec = resolve_agent("random", {"seed": seed})
        return {c.case_id: [(e["action"], e["args"]) for e in
                               engine.play(prepare(c), spec, reward="dense").ledger] for c in cases}

    first = ledgers(1, CASES[:4])
    assert first == ledgers(1, CASES[:4])
    assert first == ledgers(1, CASES[3::-1])  # another order, the same calls per case
    assert first != ledgers(2, CASES[:4])
    tools = {a for episode in ledgers(3, CASES[:4]).values() for a, _ in episode}
    assert {"list_batches", "submit_report"} <= tools and len(tools) >= 4
    # through the env (tools.episode_seed), the same calls as through the engine
    case_id = CASES[2].case_id
    dense_env.reset(options={"case_id": case_id})
    steps: list[Recorded] = []
    make_agent("random", seed=1).play(EnvTools(dense_env, steps))
    assert [(e["action"], e["args"]) for e in dense_env.session.result.ledger] == first[case_id]


def test_cli_replay_reward_dense(tmp_path, capsys):
    case = CASES[8]
    env = GateEnv(CASES, reward="dense")
    steps = recorded(env, "careful", case.case_id, as_text=True)  # actions as JSON text
    env.close()
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"case_id": case.case_id, "calls": [s.action for s in steps]}) + "\n")
    assert main(["replay", "--cases", str(EVAL), "--trajectories", str(traj), "--json", "--reward", "dense"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["rewards"] == [s.reward for s in steps]
    assert line["dense_return"] == pytest.approx(sum(s.reward for s in steps))
    assert line["grade"]["reward"] == json.loads(steps[-1].info["grade"])["reward"] == 1.0


def test_cli_dense_report_careful_far_above_random(capsys):
    assert main(["report", "--reward", "dense", "--cases", str(EVAL), "--json", "--seed", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    policies = out["policies"]
    assert list(policies) == ["random", "naive", "careful-sql", "careful"] and out["cases"] == len(CASES)
    for name in ("careful-sql", "careful"):
        assert policies[name]["return"]["mean"] > policies["random"]["return"]["mean"] + 0.5
        assert policies[name]["terminal"]["min"] == 1.0
    for p in policies.values():
        assert p["return"]["mean"] == pytest.approx(p["step"]["mean"] + p["terminal"]["mean"])
        assert p["step"]["max"] <= 0.5 and p["step"]["min"] >= -0.2
    assert main(["report", "--reward", "dense", "--cases", str(EVAL)]) == 0
    text = capsys.readouterr().out
    assert "careful - random:" in text and "terminal" in text


def test_cli_dense_report_without_random_plays_the_agents_named(capsys):
    """The seed is random's option: given only when random plays, since options for an agent not played are
    refused (a misspelt name would be dropped without a word)."""
    assert main(["report", "--reward", "dense", "--cases", str(EVAL), "--json", "--agents", "naive"]) == 0
    assert list(json.loads(capsys.readouterr().out)["policies"]) == ["naive"]


def test_dense_return_splits_into_step_and_terminal_as_the_report_does():
    from gate_pipeline.cli.dense import parts
    for case in CASES[:6]:
        result = engine.play(prepare(case), "careful-sql", reward="dense")
        split = parts(result)
        assert split["terminal"] == result.grade.reward == 1.0
        assert split["step"] == pytest.approx(result.total_reward - result.grade.reward, abs=1e-12)
        assert -0.2 - 1e-9 <= split["step"] <= 0.5 + 1e-9 and split["step"] > 0


def test_gymnasium_registration():
    env = gymnasium.make("gate/Gate-v0", cases=str(EVAL), reward="dense")
    assert isinstance(env.unwrapped, GateEnv)
    obs, info = env.reset(seed=2)
    assert info["case_id"] == CASES[int(np_random(2)[0].integers(len(CASES)))].case_id
    env.reset(options={"case_id": "eval-clean-control-0"})
    obs, reward, term, trunc, info = env.step({"tool": "run_sql", "args": {"query": "SELECT 1"}})
    assert reward == 0.025 and not term and not trunc
    env.close()


def fresh_python(code: str, tmp_path) -> subprocess.CompletedProcess:
    """Run code in a new interpreter, outside the repository (nothing of gate imported beforehand)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_gymnasium_make_in_a_fresh_process_passes_check_env_with_warnings_as_errors(tmp_path):
    code = """
import json, sys, warnings
warnings.simplefilter("error")
import gymnasium
from gymnasium.utils.env_checker import check_env
assert "gate_pipeline" not in sys.modules
env = gymnasium.make("gate_pipeline:gate/Gate-v0")
check_env(env.unwrapped)
obs, info = env.reset(seed=0)
assert env.observation_space.contains(obs) and env.action_space.contains('{"tool": "list_batches"}')
obs, reward, term, trunc, info = env.step('{"tool": "list_batches"}')
assert env.observation_space.contains(obs) and isinstance(json.loads(info["result"]), list)
env.close()
print("checked")
"""
    p = fresh_python(code, tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "checked", p.stderr[-3000:]


def test_a_terminal_reward_episode_does_not_import_pandas(tmp_path):
    code = f"""
import json, sys
import gymnasium
env = gymnasium.make("gate_pipeline:gate/Gate-v0", cases={str(EVAL)!r})
from gate_pipeline.kernel import engine
from gate_pipeline.kernel.agents import make_agent
from gate_pipeline.kernel.engine import prepare

class Tools:
    episode_seed = 0
    def __call__(self, name, **args):
        return self.act({{"tool": name, "args": args}})
    def act(self, action):
        obs, reward, term, trunc, info = env.step(json.dumps(action))
        self.last = (reward, term, info)
        return json.loads(info["result"])

env.reset(options={{"case_id": "eval-orphan-customer-1"}})
tools = Tools()
make_agent("careful-sql").play(tools)
reward, term, info = tools.last
assert term and reward == 1.0, (reward, term)
result = engine.play(prepare(env.unwrapped.cases[0]), "careful-sql")
assert result.grade.reward == 1.0
print("pandas" in sys.modules, "pandera" in sys.modules)
"""
    p = fresh_python(code, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["False", "False"]
