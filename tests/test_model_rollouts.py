"""Concurrent rollouts against the scripted server: the run store, transcripts, resume, pass@1 / pass^k."""
from __future__ import annotations

import asyncio
import gc
import json
from fractions import Fraction

import pytest
from scripted_server import ScriptedServer

from gate_pipeline.kernel.engine import Session, prepare
from gate_pipeline.kernel.ledger import chain_intact
from gate_pipeline.kernel.records import Grade
from gate_pipeline.kernel.settings import Settings
from gate_pipeline.model_agent.agent import ModelSettings
from gate_pipeline.model_agent.passk import pass_rates, pass_table
from gate_pipeline.model_agent.rollouts import EndpointError, RunError, read_transcripts, run_rollouts
from gate_pipeline.store import ENDED, RunStore, StoreSink


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _clean(server):
    server.faults.clear()
    yield
    server.faults.clear()


@pytest.fixture
def store(tmp_path):
    s = RunStore(Settings(home=tmp_path / "home"))
    yield s
    s.dispose()


def settings(server, model="scripted", **kw):
    return ModelSettings(model=model, base_url=server.url, **kw)


def run(cases, s, rollouts, concurrency, run_dir, store, on_done=None):
    return asyncio.run(run_rollouts(cases, s, rollouts, concurrency, run_dir, store, on_done))


def lines(run_dir):
    return (run_dir / "transcripts.jsonl").read_text().splitlines()


def transcripts(run_dir) -> dict[str, dict]:
    """Transcript lines by episode id."""
    return {t["episode_id"]: t for t in read_transcripts(run_dir / "transcripts.jsonl")}


def test_rollouts_run_concurrently_and_write_one_full_transcript_line_each(server, eval_cases, tmp_path, store):
    cases = eval_cases[::8]  # every 8th case: 4 cases from 4 families
    out = run(cases, settings(server), 3, 4, tmp_path / "r1", store)
    records = out["records"]
    assert out["new"] == 12 and out["kept"] == 0 and len(lines(tmp_path / "r1")) == 12
    assert [(r["case_id"], r["rollout"]) for r in records] == [(c.case_id, i) for c in cases for i in range(3)]
    lines_by_id = transcripts(tmp_path / "r1")
    assert set(lines_by_id) == {r["episode_id"] for r in records}  # one line per played episode
    for r in records:
        assert isinstance(r["grade"], Grade) and r["key"] == f"{r['case_id']}#{r['rollout']}"
        assert r["reward"] == r["grade"].reward == 1.0 and r["end_reason"] == "reported" and r["grade"].finished
        assert r["error"] == "" and r["counts"]["tool_calls"] > 0 and r["usage"]["total_tokens"] > 0
        t = lines_by_id[r["episode_id"]]
        assert t["key"] == r["key"] and t["run_id"] == "r1" and t["model"] == "scripted"
        assert t["grade"] == r["grade"].as_dict() and t["counts"] == r["counts"] and t["usage"] == r["usage"]
        assert t["messages"][0]["role"] == "system" and t["messages"][-1]["role"] == "tool"
        assert t["tool_calls"][-1]["name"] == "submit_report" and len(t["tool_calls"]) == t["counts"]["tool_calls"]
        assert chain_intact(t["ledger"]) and t["ledger"][-1]["action"] == "submit_report"
        assert t["usage"]["total_tokens"] > 0 and t["timings"]["wall_seconds"] >= t["timings"]["model_seconds"] > 0
        assert t["settings"]["model"] == "scripted" and "api_key" not in json.dumps(t["settings"]).replace(
            "api_key_env", "")
    rows = store.episodes(run_id="r1")
    assert len(rows) == 12 and all(row["status"] == ENDED and row["agent"] == "scripted" for row in rows)
    assert sorted((row["case_id"], row["rollout"]) for row in rows) == sorted((c.case_id, i)
                                                                             for c in cases for i in range(3))
    meta = json.loads((tmp_path / "r1" / "run.json").read_text())
    assert meta["run_id"] == "r1" and meta["rollouts"] == 3
    rates = pass_rates(records, 3)
    assert rates["all"] == {"cases": 4, "pass@1": 1.0, "pass^3": 1.0}


def test_an_interrupted_run_resumes_without_redoing_finished_rollouts(server, eval_cases, tmp_path, store):
    cases = eval_cases[:6]
    seen = []

    def interrupt_after_three(result):
        seen.append((result.case_id, result.rollout))
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cases, settings(server), 2, 3, tmp_path / "r", store, interrupt_after_three)
    gc.collect()  # the interrupted task's "exception never retrieved" is logged here, not at exit
    first = lines(tmp_path / "r")
    finished = {json.loads(line)["key"] for line in first if json.loads(line)["end_reason"] == "reported"}
    assert finished == {f"{c}#{i}" for c, i in seen}
    # the rollouts in flight when the run was interrupted are ended as cut off, never left running
    rows = store.episodes(run_id="r")
    assert all(row["status"] == ENDED for row in rows)
    assert {row["end_reason"] for row in rows} <= {"reported", "abandoned"}
    before = server.requests["scripted"]
    out = run(cases, settings(server), 2, 3, tmp_path / "r", store)
    assert out["new"] == 9 and out["kept"] == 3
    assert server.requests["scripted"] - before == 9 * 4  # only the nine unfinished rollouts asked the model
    assert [r["end_reason"] for r in out["records"]] == ["reported"] * 12
    after = lines(tmp_path / "r")
    assert after[:len(first)] == first and len(after) == len(first) + 9  # an export: appended, never rewritten
    assert len({json.loads(line)["key"] for line in after}) == 12
    again = run(cases, settings(server), 2, 3, tmp_path / "r", store)
    assert again["new"] == 0 and again["kept"] == 12 and len(lines(tmp_path / "r")) == len(after)


def test_resume_is_decided_by_the_store_not_by_the_transcripts(server, eval_cases, tmp_path, store):
    cases = eval_cases[:2]
    run(cases, settings(server), 1, 2, tmp_path / "t", store)
    path = tmp_path / "t" / "transcripts.jsonl"
    kept = path.read_text().splitlines()[0]
    path.write_text(kept + "\n" + '{"key": "eval-clean-cont')  # the process died mid-write
    out = run(cases, settings(server), 1, 2, tmp_path / "t", store)
    assert out["new"] == 0 and out["kept"] == 2 and all(r["reward"] == 1.0 for r in out["records"])
    # the torn tail was cut, and the stored episode it was the line of written again, from the store
    stored = {r["episode_id"]: r for r in store.episodes(run_id="t")}
    assert path.read_text().splitlines()[0] == kept
    assert {t["episode_id"] for t in read_transcripts(path)} == set(stored) and len(read_transcripts(path)) == 2
    path.unlink()  # no transcripts at all: still nothing to play again, and the file holds the store's episodes
    again = run(cases, settings(server), 1, 2, tmp_path / "t", store)
    assert again["new"] == 0 and again["kept"] == 2 and [r["reward"] for r in again["records"]] == [1.0, 1.0]
    written = read_transcripts(path)
    assert {t["episode_id"] for t in written} == set(stored) and all(t["grade"]["reward"] == 1.0 for t in written)
    assert all(t["ledger"] == store.entries(t["episode_id"]) and t["messages"] for t in written)
    path.write_text("not json\n" + kept + "\n")
    with pytest.raises(RunError, match=r"transcripts.jsonl:1: not a rollout record \(not JSON: Expecting value"):
        read_transcripts(path)
    path.write_text("[1]\n" + kept + "\n")
    with pytest.raises(RunError) as refused:
        read_transcripts(path)
    assert str(refused.value).endswith("transcripts.jsonl:1: not a rollout record (not a JSON object with a text 'key')")


def test_running_and_abandoned_episodes_are_played_again_a_finished_one_is_kept(server, eval_cases, tmp_path,
                                                                                store):
    cases = eval_cases[:4]
    sink = StoreSink(store)
    running = Session(prepare(cases[0]), "careful", sinks=(sink,), run_id="s", rollout=0)  # its process died
    running.call("list_batches", {})
    died = Session(prepare(cases[1]), "careful", sinks=(sink,), run_id="s", rollout=0)
    assert store.close_abandoned(died.episode_id, "the worker died")
    died.episode.close()
    ended = Session(prepare(cases[2]), "careful", sinks=(sink,), run_id="s", rollout=0)
    ended.call("list_batches", {})
    ended.finish()  # ended without a report: that is the rollout's result
    running.episode.close()
    out = run(cases, settings(server), 1, 2, tmp_path / "s", store)
    assert out["new"] == 3 and out["kept"] == 1  # cases 0 and 1 again, case 3 never played
    assert [r["end_reason"] for r in out["records"]] == ["reported", "reported", "no_report", "reported"]
    assert [r["reward"] for r in out["records"]] == [1.0, 1.0, 0.0, 1.0]
    assert out["records"][2]["episode_id"] == ended.episode_id


def test_rollouts_ended_by_a_server_fault_are_redone_on_resume(server, eval_cases, tmp_path, store):
    cases = eval_cases[:3]
    server.faults[:] = [500, 500]
    out = run(cases, settings(server, retries=0), 1, 1, tmp_path / "f", store)
    reasons = [r["end_reason"] for r in out["records"]]
    assert reasons == ["api_error", "api_error", "reported"]
    assert out["records"][0]["reward"] == 0.0 and "HTTP 500" in out["records"][0]["error"]
    assert out["records"][0]["grade"].failed and "HTTP 500" in out["records"][0]["grade"].reason
    again = run(cases, settings(server, retries=0), 1, 1, tmp_path / "f", store)
    assert again["new"] == 2 and [r["end_reason"] for r in again["records"]] == ["reported"] * 3
    assert len(lines(tmp_path / "f")) == 5  # the newer line supersedes; nothing is rewritten
    assert len(store.episodes(run_id="f")) == 5  # the store keeps every episode; the latest one counts


def test_max_turns_is_the_models_result_and_is_kept_on_resume(server, eval_cases, tmp_path, store):
    s = settings(server, model="silent", max_turns=2)
    out = run(eval_cases[:1], s, 1, 1, tmp_path / "m", store)
    assert out["records"][0]["end_reason"] == "max_turns" and out["records"][0]["reward"] == 0.0
    assert run(eval_cases[:1], s, 1, 1, tmp_path / "m", store)["new"] == 0


def test_a_run_id_cannot_be_resumed_with_another_model_or_a_bad_id(server, eval_cases, tmp_path, store):
    run(eval_cases[:1], settings(server), 1, 1, tmp_path / "x", store)
    with pytest.raises(RunError, match="made with model='scripted', not 'silent'"):
        run(eval_cases[:1], settings(server, model="silent"), 1, 1, tmp_path / "x", store)
    with pytest.raises(RunError, match="run id"):
        run(eval_cases[:1], settings(server), 1, 1, tmp_path / "bad id", store)


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


def test_pass_hat_k_is_below_pass_at_1_for_a_policy_that_succeeds_half_the_time(server, eval_cases, tmp_path,
                                                                                   store):
    records = run(eval_cases[:4], settings(server, model="coin"), 4, 1, tmp_path / "coin", store)["records"]
    rewards = [r["reward"] for r in records]
    assert 1.0 in rewards and any(x < 1.0 for x in rewards)
    lines_by_id = transcripts(tmp_path / "coin")
    plans = {lines_by_id[r["episode_id"]]["messages"][2]["content"] for r in records}
    assert plans == {"plan: careful", "plan: quick"}
    rates = pass_rates(records, 4)["all"]
    assert rates["pass^4"] < rates["pass@1"] < 1.0


def test_the_benchmarks_asyncio_server_plays_the_same_policies(eval_cases, tmp_path, store):
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).with_name("scripted_server.py")
    proc = subprocess.Popen([sys.executable, str(script), "--asyncio"], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        s = ModelSettings(model="scripted", base_url=url)
        out = run(eval_cases[:4], s, 2, 4, tmp_path / "a", store)
        assert [r["reward"] for r in out["records"]] == [1.0] * 8
        assert [t["turns"] for t in transcripts(tmp_path / "a").values()] == [4] * 8
        bad = run(eval_cases[:1], ModelSettings(model="garbage", base_url=url), 1, 1, tmp_path / "g", store)
        assert bad["records"][0]["end_reason"] == "api_error"
        with pytest.raises(EndpointError, match="nowhere/chat/completions answered HTTP 404"):
            run(eval_cases[:1], ModelSettings(model="scripted", base_url=url + "/nowhere"), 1, 1, tmp_path / "n", store)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a server that inherited an ignored SIGTERM
            proc.kill()
            proc.wait()
