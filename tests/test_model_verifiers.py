"""gate as a verifiers 0.3 environment, against the scripted chat-completions server (skips without the extra)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers", reason="the 'verifiers' extra is not installed")
if not vf.__version__.startswith("0.3."):
    pytest.skip(f"gate's adapter targets verifiers 0.3.x, not {vf.__version__}", allow_module_level=True)

from openai import AsyncOpenAI  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402
from verifiers.legacy.clients import OpenAIChatCompletionsClient  # noqa: E402

from gate_pipeline.integrations.verifiers_env import load_environment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


def evaluate(env, server, model, n=3, r=2):
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=server.url, api_key="x"))
    out = asyncio.run(env.evaluate(client=client, model=model, num_examples=n, rollouts_per_example=r,
                                   max_concurrent=4, on_progress=[]))
    return out["outputs"]


def test_careful_policy_scores_one_with_terms_logged_at_weight_zero(server):
    env = load_environment(num_cases=3)
    outs = evaluate(env, server, "scripted")
    assert len(outs) == 6 and [o["reward"] for o in outs] == [1.0] * 6
    for o in outs:
        assert o["disposition"] == o["report"] == o["evidence"] == o["inspected"] == 1.0
        assert o["finished"] == 1.0 and o["stop_condition"] == "has_final_env_response"
        assert o["reward"] == o["gate_reward"]  # the terms are metrics (weight 0), not added to the reward


@pytest.mark.parametrize("model", ["invalid-json", "unknown-tool", "mistyped-arg", "no-tool-call"])
def test_malformed_output_is_answered_and_the_rollout_goes_on(server, model):
    outs = evaluate(load_environment(num_cases=2), server, model, n=2, r=1)
    assert [o["reward"] for o in outs] == [1.0, 1.0]
    first_reply = outs[0]["completion"][1]
    if model == "no-tool-call":
        assert first_reply["role"] == "user" and "submit_report" in first_reply["content"]
    else:
        assert first_reply["role"] == "tool" and '"error"' in first_reply["content"]


def test_no_report_no_credit_at_max_turns(server):
    outs = evaluate(load_environment(num_cases=1, max_turns=3), server, "silent", n=1, r=1)
    assert outs[0]["reward"] == 0.0 and outs[0]["stop_condition"] == "max_turns_reached"


def test_bad_environment_arguments_are_clear_errors(tmp_path):
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no cases"):
        load_environment(cases_path=str(empty))


def test_vf_eval_runs_gate(server, tmp_path):
    vf_eval = Path(sys.executable).with_name("vf-eval")
    env = {**os.environ, "GATE_TEST_KEY": "x"}
    done = subprocess.run([str(vf_eval), "gate_pipeline.integrations.verifiers_env", "-m", "scripted",
                           "-b", server.url, "-k", "GATE_TEST_KEY", "-n", "2", "-r", "2", "--disable-tui",
                           "--disable-env-server", "-a", '{"num_cases": 2}'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stop_conditions: has_final_env_response: 1.000" in done.stdout
    assert "reward: avg - 1.000" in done.stdout
    assert "pass^k: 1=1.000, 2=1.000" in done.stdout


def test_pass_counts_only_reward_one_as_gate_does():
    assert load_environment(num_cases=1).pass_threshold == 1.0


def test_the_rollout_state_holds_an_engine_session_then_the_grade_ledger_and_counts(server):
    from dataclasses import fields

    from gate_pipeline.kernel.ledger import chain_intact
    from gate_pipeline.kernel.records import Grade
    env = load_environment(num_cases=1)
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=server.url, api_key="x"))
    out = asyncio.run(env.evaluate(client=client, model="invalid-json", num_examples=1, rollouts_per_example=1,
                                   max_concurrent=1, on_progress=[], state_columns=["gate_grade", "gate_session"]))
    o = out["outputs"][0]
    grade = o["gate_grade"]
    # the grade's fields, a suite's metrics flattened into it (a classic grade has none)
    assert set(grade) == {f.name for f in fields(Grade) if f.name != "metrics"} | {"ledger", "counts"}
    assert grade["reward"] == o["reward"] == 1.0 and grade["finished"] and not grade["failed"]
    assert chain_intact(grade["ledger"]) and grade["ledger"][-1]["action"] == "submit_report"
    first = grade["ledger"][0]  # the malformed call reached the session, which refused and logged it
    assert first["action"] == "profile_batch" and not first["executed"] and first["note"] == "malformed action"
    assert grade["counts"] == {"tool_calls": len(grade["ledger"]), "tool_errors": 1, "nudges": 0, "dropped_calls": 0}
    assert o["gate_session"] is None  # the session is closed once graded


def test_setup_state_opens_an_engine_session_and_cleanup_grades_it():
    from gate_pipeline.kernel.engine import Session
    env = load_environment(num_cases=1)
    case_id = env.pool.ids[0]
    state = asyncio.run(env.setup_state({"info": {"case_id": case_id}}))
    session = state["gate_session"]
    assert isinstance(session, Session) and session.prepared.case_id == case_id and not session.done
    session.step({"tool": "list_batches"})
    asyncio.run(env.grade_and_close(state))
    assert session.done and state["gate_session"] is None
    assert state["gate_grade"]["reward"] == 0.0 and not state["gate_grade"]["finished"]  # no report, no credit
    assert [e["action"] for e in state["gate_grade"]["ledger"]] == ["list_batches"]
    with pytest.raises(vf.Error):
        asyncio.run(env.setup_state({"info": {"case_id": "nope"}}))


def test_calls_after_an_accepted_report_in_the_same_reply_are_refused_and_not_graded():
    """A reply [submit_report, load_batch, ...]: the loads after the accepted report reached the warehouse and the
    grade (0.65 where the report alone earns 0.15), where gate run, gate serve and the gymnasium env refuse them."""
    import json
    from types import SimpleNamespace

    env = load_environment(num_cases=1)

    def episode(after_report: bool) -> tuple[list, dict]:
        state = asyncio.run(env.setup_state({"info": {"case_id": env.pool.ids[0]}}))
        batches = [b["batch_id"] for b in state["gate_session"].step({"tool": "list_batches"}).result]
        calls = [SimpleNamespace(id="r", name="submit_report",
                                 arguments=json.dumps({"loaded": [], "quarantined": batches}))]
        calls += [SimpleNamespace(id=b, name="load_batch", arguments=json.dumps({"batch_id": b}))
                  for b in batches] if after_report else []
        answers = asyncio.run(env.env_response([SimpleNamespace(tool_calls=calls)], state))
        asyncio.run(env.grade_and_close(state))
        return [json.loads(m.content) for m in answers[1:]], state["gate_grade"]

    alone, graded_alone = episode(False)
    refused, graded = episode(True)
    assert refused and all("over" in answer["error"] for answer in refused), refused
    assert [e["action"] for e in graded["ledger"]] == ["list_batches", "submit_report"]
    assert graded["reward"] == graded_alone["reward"] < 1.0


def test_vf_eval_finds_load_environment_by_the_package_name():
    """`vf-eval gate-pipeline` and `vf-eval gate_pipeline`: verifiers imports the package and calls load_environment."""
    from verifiers.legacy.utils.env_utils import load_environment as vf_load
    for env_id in ("gate-pipeline", "gate_pipeline"):
        env = vf_load(env_id, num_cases=2)
        assert type(env).__name__ == "GateEnv" and len(env.pool) == 2


def test_a_reply_plays_at_most_64_tool_calls_and_answers_the_rest_unplayed(server):
    """A reply of a thousand tool calls played a thousand steps. The first 64 are played; every other call is still
    answered (the next request needs an answer to each), as not played, and counted."""
    env = load_environment(num_cases=1)
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=server.url, api_key="x"))
    out = asyncio.run(env.evaluate(client=client, model="flood", num_examples=1, rollouts_per_example=1,
                                   max_concurrent=1, on_progress=[], state_columns=["gate_grade"]))
    o = out["outputs"][0]
    grade = o["gate_grade"]
    answers = [m for m in o["completion"] if m["role"] == "tool"][:1000]
    assert len(answers) == 1000 and sum('"not played: a reply plays at most 64 tool calls"' in m["content"]
                                        for m in answers) == 936
    assert grade["counts"]["dropped_calls"] == 936 and grade["counts"]["tool_calls"] == len(grade["ledger"])
    assert sum(1 for e in grade["ledger"] if e["action"] == "list_batches") <= 64 + 1 and grade["finished"]

