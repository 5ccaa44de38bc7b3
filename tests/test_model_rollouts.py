"""Concurrent rollouts against the scripted server: transcripts, resume, pass@1 / pass^k."""
from __future__ import annotations

import asyncio
import gc
import json
from fractions import Fraction

import pytest

from gate_pipeline.ledger import chain_intact
from gate_pipeline.model_agent.agent import ModelSettings
from gate_pipeline.model_agent.passk import pass_rates, pass_table
from gate_pipeline.model_agent.rollouts import RunError, read_transcripts, run_rollouts
from scripted_server import ScriptedServer


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _clean(server):
    server.faults.clear()
    yield
    server.faults.clear()


def settings(server, model="careful", **kw):
    return ModelSettings(model=model, base_url=server.url, backoff=0.01, **kw)


def run(cases, s, rollouts, concurrency, run_dir, on_done=None):
    return asyncio.run(run_rollouts(cases, s, rollouts, concurrency, run_dir, on_done))


def lines(run_dir):
    return (run_dir / "transcripts.jsonl").read_text().splitlines()


def test_rollouts_run_concurrently_and_write_one_full_transcript_line_each(server, eval_cases, tmp_path):
    cases = eval_cases[::8]  # every 8th case: 4 cases from 4 families
    out = run(cases, settings(server), 3, 4, tmp_path / "r1")
    records = out["records"]
    assert out["new"] == 12 and out["kept"] == 0 and len(lines(tmp_path / "r1")) == 12
    assert [(r["case_id"], r["rollout"]) for r in records] == [(c["case_id"], i) for c in cases for i in range(3)]
    for r in records:
        assert r["reward"] == r["grade"]["reward"] == 1.0 and r["end_reason"] == "reported" and r["finished"]
        assert r["messages"][0]["role"] == "system" and r["messages"][-1]["role"] == "tool"
        assert r["tool_calls"][-1]["name"] == "submit_report" and len(r["tool_calls"]) == r["counts"]["tool_calls"]
        assert chain_intact(r["ledger"]) and r["ledger"][-1]["action"] == "submit_report"
        assert r["usage"]["total_tokens"] > 0 and r["timings"]["wall_seconds"] >= r["timings"]["model_seconds"] > 0
        assert r["settings"]["model"] == "careful" and "api_key" not in json.dumps(r["settings"]).replace(
            "api_key_env", "")
    meta = json.loads((tmp_path / "r1" / "run.json").read_text())
    assert meta["run_id"] == "r1" and meta["rollouts"] == 3
    rates = pass_rates(records, 3)
    assert rates["all"] == {"cases": 4, "pass@1": 1.0, "pass^3": 1.0}


def test_an_interrupted_run_resumes_without_redoing_finished_rollouts(server, eval_cases, tmp_path):
    cases = eval_cases[:6]
    seen = []

    def interrupt_after_three(record):
        seen.append(record["key"])
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cases, settings(server), 2, 3, tmp_path / "r", interrupt_after_three)
    gc.collect()  # the interrupted task's "exception never retrieved" is logged here, not at exit
    first = lines(tmp_path / "r")
    assert len(first) == 3
    before = server.requests["careful"]
    out = run(cases, settings(server), 2, 3, tmp_path / "r")
    assert out["new"] == 9 and out["kept"] == 3
    assert server.requests["careful"] - before == 9 * 4  # only the nine unplayed rollouts asked the model
    after = lines(tmp_path / "r")
    assert after[:3] == first and len(after) == 12
    assert len({json.loads(l)["key"] for l in after}) == 12
    again = run(cases, settings(server), 2, 3, tmp_path / "r")
    assert again["new"] == 0 and again["kept"] == 12 and len(lines(tmp_path / "r")) == 12


def test_a_torn_last_line_is_dropped_and_redone_a_torn_middle_line_is_an_error(server, eval_cases, tmp_path):
    cases = eval_cases[:2]
    run(cases, settings(server), 1, 2, tmp_path / "t")
    path = tmp_path / "t" / "transcripts.jsonl"
    kept = path.read_text().splitlines()[0]
    path.write_text(kept + "\n" + '{"key": "eval-clean-cont')  # the process died mid-write
    out = run(cases, settings(server), 1, 2, tmp_path / "t")
    assert out["new"] == 1 and out["kept"] == 1 and all(r["reward"] == 1.0 for r in out["records"])
    assert len(read_transcripts(path)) == 2  # the torn tail was cut, not glued onto the next record
    again = run(cases, settings(server), 1, 2, tmp_path / "t")
    assert again["new"] == 0 and again["kept"] == 2
    path.write_text("not json\n" + path.read_text())
    with pytest.raises(RunError, match=r"transcripts.jsonl:1: not a rollout record"):
        read_transcripts(path)


def test_rollouts_ended_by_a_server_fault_are_redone_on_resume(server, eval_cases, tmp_path):
    cases = eval_cases[:3]
    server.faults[:] = [500, 500]
    out = run(cases, settings(server, retries=0), 1, 1, tmp_path / "f")
    reasons = [r["end_reason"] for r in out["records"]]
    assert reasons == ["api_error", "api_error", "reported"]
    assert out["records"][0]["reward"] == 0.0 and "HTTP 500" in out["records"][0]["error"]
    again = run(cases, settings(server, retries=0), 1, 1, tmp_path / "f")
    assert again["new"] == 2 and [r["end_reason"] for r in again["records"]] == ["reported"] * 3
    assert len(lines(tmp_path / "f")) == 5  # the newer line supersedes; nothing is rewritten


def test_max_turns_is_the_models_result_and_is_kept_on_resume(server, eval_cases, tmp_path):
    s = settings(server, model="silent", max_turns=2)
    out = run(eval_cases[:1], s, 1, 1, tmp_path / "m")
    assert out["records"][0]["end_reason"] == "max_turns" and out["records"][0]["reward"] == 0.0
    assert run(eval_cases[:1], s, 1, 1, tmp_path / "m")["new"] == 0


def test_a_run_id_cannot_be_resumed_with_another_model_or_a_bad_id(server, eval_cases, tmp_path):
    run(eval_cases[:1], settings(server), 1, 1, tmp_path / "x")
    with pytest.raises(RunError, match="made with model='careful', not 'silent'"):
        run(eval_cases[:1], settings(server, model="silent"), 1, 1, tmp_path / "x")
    with pytest.raises(RunError, match="run id"):
        run(eval_cases[:1], settings(server), 1, 1, tmp_path / "bad id")


def _rec(case, family, rollout, reward):
    return {"case_id": case, "family": family, "rollout": rollout, "reward": reward}


def test_pass_at_1_and_pass_hat_k_are_exact_and_per_family():
    records = [_rec("a", "f1", i, 1.0) for i in range(3)]
    records += [_rec("b", "f1", i, r) for i, r in enumerate([1.0, 0.85, 1.0])]
    records += [_rec("c", "f2", i, r) for i, r in enumerate([0.0, 0.0, 1.0])]
    records += [_rec("d", "f2", 0, 1.0)]  # incomplete: only one of three rollouts
    rates = pass_rates(records, 3)
    assert rates["f1"] == {"cases": 2, "pass@1": float((1 + Fraction(2, 3)) / 2), "pass^3": 0.5}
    assert rates["f2"] == {"cases": 1, "pass@1": float(Fraction(1, 3)), "pass^3": 0.0}
    assert rates["all"] == {"cases": 3, "pass@1": float(Fraction(2, 3)), "pass^3": float(Fraction(1, 3))}
    table = pass_table(records, 3)
    assert "pass^3" in table.splitlines()[1] and table.splitlines()[-1].split() == ["all", "3", "0.6667", "0.3333"]


def test_pass_hat_k_is_below_pass_at_1_for_a_policy_that_succeeds_half_the_time(server, eval_cases, tmp_path):
    records = run(eval_cases[:4], settings(server, model="coin"), 4, 1, tmp_path / "coin")["records"]
    rewards = [r["reward"] for r in records]
    assert 1.0 in rewards and any(x < 1.0 for x in rewards)
    plans = {r["messages"][2]["content"] for r in records}
    assert plans == {"plan: careful", "plan: quick"}
    rates = pass_rates(records, 4)["all"]
    assert rates["pass^4"] < rates["pass@1"] < 1.0


def test_the_benchmarks_asyncio_server_plays_the_same_policies(eval_cases, tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).with_name("scripted_server.py")
    proc = subprocess.Popen([sys.executable, str(script), "--asyncio"], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        s = ModelSettings(model="careful", base_url=url, backoff=0.01)
        out = run(eval_cases[:4], s, 2, 4, tmp_path / "a")
        assert [r["reward"] for r in out["records"]] == [1.0] * 8 and all(r["turns"] == 4 for r in out["records"])
        bad = run(eval_cases[:1], ModelSettings(model="garbage", base_url=url), 1, 1, tmp_path / "g")
        assert bad["records"][0]["end_reason"] == "api_error"
        lost = run(eval_cases[:1], ModelSettings(model="careful", base_url=url + "/nowhere"), 1, 1, tmp_path / "n")
        assert "HTTP 404" in lost["records"][0]["error"]
    finally:
        proc.terminate()
        proc.wait()
