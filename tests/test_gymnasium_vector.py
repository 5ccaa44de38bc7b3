"""gymnasium as vector users need it: make_vec sync and async (shared memory), info a vector env can stack,
bounded Text spaces, render_mode="ansi", max_episode_steps in the spec. Every step's observation is checked against
its info: gymnasium's shared-memory reader decodes a Text buffer once, so without gate's ObsText every async
observation would read as the first one."""
from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from gate_pipeline.integrations import gymnasium_env
from gate_pipeline.integrations.gymnasium_env import DEFAULT_MAX_TURNS, ENV_ID, MAX_TEXT_CHARS

ROOT = Path(__file__).resolve().parent.parent
EVAL = str(ROOT / "cases/classic/eval_curated.jsonl")
# at every step the four envs call tools whose results differ in type (a list, an object, an error, text)
CYCLE = ['{"tool": "list_batches"}', '{"tool": "read_contract"}',
         '{"tool": "run_sql", "args": {"query": "SELECT 1 AS one"}}', "not json at all",
         '{"tool": "submit_report", "args": {"loaded": [], "quarantined": []}}']


def drive(envs, steps: int = 100) -> dict:
    obs, info = envs.reset(seed=3)
    assert len(info["case_id"]) == 4 and all(isinstance(json.loads(t), dict) for t in info["tools"])
    ended, grades, results = 0, [], 0
    for t in range(steps):
        actions = tuple(CYCLE[(t + i) % len(CYCLE)] for i in range(4))
        obs, reward, terminated, truncated, info = envs.step(actions)
        assert reward.shape == (4,) and terminated.dtype == np.bool_
        assert envs.observation_space.contains(obs)
        for k in info.get("_result", np.zeros(4, bool)).nonzero()[0]:
            json.loads(info["result"][k])  # JSON text in every env
            assert obs["result"][k] == info["result"][k]  # this step's observation (not a stale buffer)
            results += 1
        if "grade" in info:
            grades += [json.loads(info["grade"][k]) for k in info["_grade"].nonzero()[0]]
        ended += int(terminated.sum() + truncated.sum())
    return {"ended": ended, "grades": grades, "results": results}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_steps_100_times_over_4_envs(mode):
    started = time.monotonic()
    envs = gymnasium.make_vec("gate_pipeline:" + ENV_ID, num_envs=4, vectorization_mode=mode, cases=EVAL)
    built = time.monotonic() - started
    try:
        out = drive(envs)
    finally:
        envs.close()
    assert built < 30, f"{mode}: {built:.1f} s to construct"  # unbounded Text spaces took 83 s in shared memory
    assert out["ended"] >= 4 * 100 // len(CYCLE) - 4 and out["results"] >= 300
    assert out["grades"] and all(g["finished"] and g["suite"] == "classic" for g in out["grades"])


def test_async_vector_env_without_shared_memory_too():
    envs = gymnasium.make_vec("gate_pipeline:" + ENV_ID, num_envs=4, vectorization_mode="async", cases=EVAL,
                              vector_kwargs={"shared_memory": False})
    try:
        assert drive(envs, 20)["results"] >= 60
    finally:
        envs.close()


def test_every_info_value_is_a_number_or_text():
    env = gymnasium.make("gate_pipeline:" + ENV_ID, cases=EVAL, reward="dense")
    obs, info = env.reset(seed=0)
    seen = [info]
    for action in CYCLE:
        seen.append(env.step(action)[4])
    seen.append(env.step(CYCLE[0])[4])  # after the end
    for info in seen:
        for key, value in info.items():
            assert isinstance(value, (str, int, float, bool)), (key, type(value))


def test_the_spec_has_max_episode_steps_and_the_env_truncates_on_that_step_graded():
    assert gymnasium.spec(ENV_ID).max_episode_steps == DEFAULT_MAX_TURNS
    env = gymnasium.make("gate_pipeline:" + ENV_ID, cases=EVAL, max_turns=3, max_episode_steps=3)
    assert env.spec.max_episode_steps == 3
    env.reset(seed=0)
    out = [env.step(CYCLE[0]) for _ in range(3)]
    assert [o[3] for o in out] == [False, False, True]
    grade = json.loads(out[-1][4]["grade"])  # the env ended (and graded) the episode on TimeLimit's step
    assert grade["reward"] == 0.0 and not grade["finished"] and env.unwrapped.session.done
    env = gymnasium.make("gate_pipeline:" + ENV_ID, cases=EVAL)  # the defaults agree: 64 steps
    env.reset(seed=0)
    for _ in range(DEFAULT_MAX_TURNS - 1):
        assert not env.step(CYCLE[0])[3]
    last = env.step(CYCLE[0])
    assert last[3] and "grade" in last[4]


def test_render_mode_ansi_renders_the_last_step_as_text():
    env = gymnasium.make("gate_pipeline:" + ENV_ID, cases=EVAL, render_mode="ansi")
    env.reset(options={"case_id": "eval-amount-bounds-0"})
    assert env.render().startswith("case eval-amount-bounds-0 turn 0")
    env.step(CYCLE[0])
    text = env.render()
    assert "turn 1" in text and '> {"tool": "list_batches"}' in text and "B-0930-70-1" in text
    with pytest.raises(ValueError, match="render_mode"):
        gymnasium_env.GateEnv(EVAL, render_mode="human")
    assert gymnasium_env.GateEnv(EVAL).render() is None


def test_text_spaces_are_bounded_and_a_longer_result_is_valid_json_that_says_so():
    env = gymnasium_env.GateEnv(EVAL)
    assert env.observation_space["result"].max_length == env.observation_space["prompt"].max_length == MAX_TEXT_CHARS
    env.reset(options={"case_id": "eval-clean-control-0"})
    wide = "SELECT a.*, b.*, c.* FROM stg_b_0930_60_1 a, stg_b_0930_60_1 b, stg_b_0930_60_1 c"  # 50 rows of 18 columns
    obs, *_ = env.step({"tool": "run_sql", "args": {"query": wide}})
    assert len(json.loads(obs["result"])["rows"]) == 50 and env.observation_space.contains(obs)
    long = json.dumps({"rows": ["x" * 1000] * 300})
    bounded = gymnasium_env._bounded(long)
    assert len(bounded) < MAX_TEXT_CHARS and "more than the observation's" in json.loads(bounded)["error"]
    assert gymnasium_env._bounded('{"ok": 1}') == '{"ok": 1}'


def test_render_never_raises_on_a_hostile_action():
    env = gymnasium_env.GateEnv(EVAL, render_mode="ansi")
    env.reset(seed=0)
    deep: dict = {"a": 1}
    for _ in range(5000):
        deep = {"a": deep}
    env.step({"tool": "run_sql", "args": deep})
    assert "not JSON" in env.render()
    env.step("x" * 20_000)
    assert len(env.render()) < 5000
    # an action's control characters are escaped: it cannot clear the terminal or forge a line of its own
    env.step('\x1b[2J\x1b[31mHACKED\r\n{"ok": true}\x00')
    action_line = env.render().splitlines()[1]
    assert action_line == '> \\x1b[2J\\x1b[31mHACKED\\r\\n{"ok": true}\\x00'
    assert env.render().count("\n") == 3 and "\x1b" not in env.render()
