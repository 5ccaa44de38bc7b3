"""The nightly job's scoreboard is `gate report`: same figures, same tables, plus a history.

The multiprocess executor's scoreboard is compared in benchmarks/bench_nightly.py (each step
there is a fresh process, seconds apiece: too slow for the suite)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.instance import prepare_instance_dir
from gate_pipeline.dagster_defs.jobs import nightly_run_config
from gate_pipeline.dagster_defs.scoreboard import regressions
from gate_pipeline.kernel.cases import read_cases, write_cases
from gate_pipeline.kernel.records import Grade
from gate_pipeline.store import RunStore
from gate_pipeline.tables import baseline_tables, summary

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
AGENTS = ["naive", "careful", "refuse-all"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    return tmp_path / "gate"


def scoreboard_metadata(result):
    [mat] = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
             if e.event_specific_data.materialization.asset_key.path == ["scoreboard"]]
    return mat.metadata


def test_nightly_scoreboard_equals_gate_report(home, capsys):
    assert main(["report", "--json", "--cases", str(EVAL)]) == 0
    reported = json.loads(capsys.readouterr().out)["agents"]
    assert list(reported) == AGENTS
    cases = read_cases(EVAL)
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, run_config=nightly_run_config(cases_file=str(EVAL)))
        board = result.output_for_node("scoreboard")
        meta = scoreboard_metadata(result)
        assert set(instance.get_dynamic_partitions("cases")) == {c.case_id for c in cases}
    assert board["grades"] == reported
    typed = {agent: [Grade.from_dict(g) for g in gs] for agent, gs in reported.items()}
    assert meta["summary"].value == {**summary(cases, typed), "cases_file": str(EVAL)}
    assert board["tables"] == baseline_tables(cases, typed, split="eval")
    assert board["tables"] in meta["tables"].value
    assert meta["episodes"].value == len(cases) * len(AGENTS)
    store = RunStore()
    assert len(store.ungraded()) == len(cases) * len(AGENTS)  # left for the grading sensor to record
    [night] = store.nightly_history()
    assert night["summary"]["agents"]["careful"]["reward"] == 1.0
    assert night["run_id"] == result.run_id
    assert {ep["run_id"] for ep in store.episodes()} == {result.run_id}


def _table(markdown: str) -> list[list[str]]:
    """A markdown table's rows (after its header and rule) as lists of cells."""
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in markdown.splitlines()[2:]]


def test_each_chunk_is_one_observation_of_the_scoreboard_with_its_episodes(home):
    """What a night shows in Dagster as it plays: one observation of `scoreboard` per chunk (not one per load,
    quarantine and report), whose table has a row per episode the chunk stored, with the batches its ledger
    loaded, its other decisions, the reward it was graded and how it ended."""
    cases = read_cases(EVAL)
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, run_config=nightly_run_config(cases_file=str(EVAL), chunk_size=8))
        board = result.output_for_node("scoreboard")
    observed = [e.event_specific_data.asset_observation for e in result.all_events
                if e.event_type_value == "ASSET_OBSERVATION"]
    assert [o.asset_key.path for o in observed] == [["scoreboard"]] * 4  # 32 cases in chunks of 8
    assert [o.description for o in observed] == [f"cases {i + 1}-{i + 8} of 32 x 3 agents" for i in range(0, 32, 8)]
    rows = [row for o in observed for row in _table(o.metadata["played"].value)]
    assert [o.metadata["episodes"].value for o in observed] == [24] * 4
    store = RunStore()
    stored = {ep["episode_id"]: ep for ep in store.episodes(run_id=result.run_id)}
    assert sorted(row[6] for row in rows) == sorted(stored) and len(rows) == len(cases) * len(AGENTS)
    decisions = 0
    for case_id, agent, loaded, other, reward, ended, episode_id in rows:
        entries = [e for e in store.entries(episode_id) if e["executed"]]
        loads = [e["args"]["batch_id"] for e in entries if e["action"] == "load_batch"]
        quarantines = [e["args"] for e in entries if e["action"] == "quarantine_batch"]
        decisions += len(loads) + len(quarantines) + 1  # and the report
        assert stored[episode_id]["case_id"] == case_id and stored[episode_id]["agent"] == agent
        assert loaded == (", ".join(loads) or "none")
        assert other == ("; ".join(f"quarantine_batch {q['batch_id']} (column={q['column']}; "
                                   f"defect_type={q['defect_type']})" for q in quarantines) or "none")
        assert ended == stored[episode_id]["end_reason"] == "reported"
        index = next(i for i, c in enumerate(cases) if c.case_id == case_id)
        assert float(reward) == board["grades"][agent][index]["reward"]
    assert decisions > 2 * len(observed) * 24  # what one observation per decision would have written


def test_history_and_regressions(home, tmp_path):
    small = tmp_path / "eval_small.jsonl"
    write_cases(small, read_cases(EVAL)[:4])
    job = defs.resolve_job_def("nightly_benchmark")
    with dg.DagsterInstance.ephemeral() as instance:
        for agents in (["careful"], ["careful"]):
            result = job.execute_in_process(instance=instance,
                                            run_config=nightly_run_config(str(small), agents, chunk_size=3))
    meta = scoreboard_metadata(result)
    assert meta["history"].value.count("eval_small.jsonl") == 2
    assert meta["regressions"].value == []
    before = {"cases_file": "f", "agents": {"careful": {"reward": 1.0}}}
    fell = regressions(before, {"cases_file": "f", "agents": {"careful": {"reward": 0.9}}})
    assert fell == ["careful: 1.0000 -> 0.9000"]
    assert regressions(before, {"cases_file": "g", "agents": {"careful": {"reward": 0.9}}}) == []


def test_bad_nightly_config_is_one_clear_failure(home, tmp_path):
    """An agent the code location does not list is refused when the run is launched: nothing runs."""
    job = defs.resolve_job_def("nightly_benchmark")
    with dg.DagsterInstance.ephemeral() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError, match="not in enum type AgentName got nope"):
            job.execute_in_process(instance=instance, raise_on_error=False,
                                   run_config=nightly_run_config(str(EVAL), ["careful", "nope"]))
        assert instance.get_runs() == []
    assert RunStore().nightly_history() == [] and RunStore().manifests() == []


def test_gate_nightly_bad_input_is_one_line(home, tmp_path, capsys, monkeypatch):
    assert main(["nightly", "--agents", "careful,bogus"]) == 2
    assert "unknown agent 'bogus'" in capsys.readouterr().err
    assert main(["nightly", "--agent-options", "[1]"]) == 2
    assert "--agent-options must be a JSON object" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["nightly", "--cases", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no cases in file" in err
    monkeypatch.setenv("GATE_DB_URL", "nosuchdb://x")
    assert main(["nightly"]) == 2
    assert "run store URL 'nosuchdb://x'" in capsys.readouterr().err


def test_gate_nightly_prints_the_scoreboard_and_history(home, tmp_path, capsys):
    small = tmp_path / "eval_small.jsonl"
    write_cases(small, read_cases(EVAL)[:2])
    assert main(["nightly", "--cases", str(small), "--agents", "naive,careful"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("eval split: 2 cases")
    assert "nightly history (mean reward):" in out and "eval_small.jsonl" in out


def test_nightly_default_cases_file_is_the_librarys_classic_eval_split(home, tmp_path, monkeypatch):
    library = tmp_path / "cases"
    write_cases(library / "classic" / "eval_curated.jsonl", read_cases(EVAL)[:2])
    monkeypatch.setenv("GATE_CASES_DIR", str(library))
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, run_config=nightly_run_config(agents=["careful"]))
    board = result.output_for_node("scoreboard")
    assert board["summary"]["cases_file"] == str(library.resolve() / "classic" / "eval_curated.jsonl")
    assert board["summary"]["cases"] == 2 and len(board["grades"]["careful"]) == 2


def test_an_interrupted_nightly_re_executed_from_failure_completes_the_scoreboard(tmp_path, monkeypatch, capsys):
    """The UI's default for a failed run: Re-execute from failure. The chunk cut off re-runs; the chunks
    that never started are played by build_scoreboard; the scoreboard is `gate report`'s."""
    from interrupted_nightly import AGENT
    dagster_home, gate_home, marker = tmp_path / "dagster", tmp_path / "gate", tmp_path / "stalled"
    prepare_instance_dir(dagster_home)
    tests = str(Path(__file__).parent)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "GATE_HOME": str(gate_home), "GATE_AGENTS": AGENT,
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    script = str(Path(tests) / "interrupted_nightly.py")
    proc = subprocess.Popen([sys.executable, script, str(EVAL), str(marker)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the nightly never reached its stalling episode"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C in the middle of the second chunk
    proc.communicate(timeout=120)

    monkeypatch.setenv("GATE_HOME", str(gate_home))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        [parent] = instance.get_runs()
        assert parent.status == dg.DagsterRunStatus.FAILURE
        started = {s.step_key for s in instance.get_run_step_stats(parent.run_id)}
        chunks = [f"scoreboard.play_chunk[cases_{i:04d}]" for i in range(0, 32, 4)]
        assert chunks[0] in started and chunks[-1] not in started  # cut off part way
    again = subprocess.run([sys.executable, script, "--reexecute", parent.run_id], env=env, capture_output=True,
                           text=True, timeout=600)
    child_id, success = again.stdout.split()
    assert success == "True", again.stderr[-3000:]
    assert main(["report", "--json", "--cases", str(EVAL), "--agents", "naive,careful"]) == 0
    reported = json.loads(capsys.readouterr().out)["agents"]
    typed = {agent: [Grade.from_dict(g) for g in reported[played_as]]
             for agent, played_as in (("naive", "naive"), (AGENT, "careful"))}
    [night] = RunStore().nightly_history()  # one scoreboard: the re-execution's
    assert night["run_id"] == child_id
    assert night["summary"] == {**summary(read_cases(EVAL), typed), "cases_file": str(EVAL)}
    # the night, its re-execution and the episodes the cut-off chunk played before it was cut: all hold
    assert main(["verify"]) == 0
    out = capsys.readouterr().out
    assert "every check holds" in out and "superseded: played again in run" in out
    # the cut-off chunk's episodes that ended before the cut (both agents on its first case, naive on its
    # second), and the one cut off: each played again by the re-execution
    superseded = [line for line in out.splitlines() if "superseded: played again in run" in line]
    assert len(superseded) == 3
    assert len([line for line in out.splitlines() if "abandoned: interrupted before the agent finished; played "
                                                      "again in run" in line]) == 1
    assert "33 episode(s) not played again" in out  # a module:Class agent GATE_AGENTS does not name


def test_an_agent_named_twice_is_refused_before_anything_is_played(home, capsys, tmp_path):
    """`--agents naive,naive` (or run config `agents: [naive, naive]`) played every case twice, kept the results by
    identity and graded the first case twice in place of the second: a wrong scoreboard, exit 0, and a manifest
    `gate verify` then refused for good. It is one line now, on every surface, and nothing is stored."""
    from gate_pipeline.kernel.engine import play_cases
    from gate_pipeline.kernel.errors import RepeatedAgent
    two = tmp_path / "two.jsonl"
    write_cases(two, [c.data for c in read_cases(EVAL)[:2]])
    for command in (["nightly"], ["report"], ["attacks"]):
        assert main([*command, "--cases", str(two), "--agents", "naive,careful,naive"]) == 2
        err = capsys.readouterr().err
        assert err == "gate: error: agent 'naive' is named twice: each agent plays each case once\n", err
    with pytest.raises(RepeatedAgent):
        play_cases(read_cases(two), ["naive", "naive"])
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, raise_on_error=False,
            run_config=nightly_run_config(cases_file=str(two), agents=["naive", "naive"]))
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "agent 'naive' is named twice" in failure.event_specific_data.error.message
    assert not RunStore().episodes()


def test_options_for_an_agent_not_played_are_refused_before_anything_is_played(home, capsys, tmp_path):
    """`--agent-options '{"carful": ...}'` (a misspelt name) was dropped without a word, and careful played without
    the options meant for it; the entry was even sealed in the night's plan. It is one line now, on the command line
    and in run config, and nothing is stored. An option object that names an agent twice is refused too."""
    two = tmp_path / "two.jsonl"
    write_cases(two, [c.data for c in read_cases(EVAL)[:2]])
    without = {"without": ["orders.amount.out_of_range"]}
    assert main(["nightly", "--cases", str(two), "--agents", "careful", "--agent-options",
                 json.dumps({"carful": without})]) == 2
    err = capsys.readouterr().err
    assert err == ("gate: error: options are given for agent 'carful', which is not one of the agents played "
                   "(careful)\n"), err
    assert main(["nightly", "--cases", str(two), "--agents", "careful", "--agent-options",
                 '{"careful": {}, "careful": {"without": ["orders.amount.out_of_range"]}}']) == 2
    assert capsys.readouterr().err == "gate: error: --agent-options names the key 'careful' twice in one object\n"
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, raise_on_error=False,
            run_config=nightly_run_config(cases_file=str(two), agents=["careful"], agent_options={"carful": without}))
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "options are given for agent 'carful'" in failure.event_specific_data.error.message
    assert not RunStore().episodes() and RunStore().manifests() == []


def test_a_completed_night_is_not_played_again_by_a_re_execution(home, tmp_path, capsys):
    """"Re-execute all" of a night that completed played it again as a continuation of it, whose manifest stayed
    open for good, and kept a second summary `gate verify` could not recompute: a store that read as tampered
    after a routine click. The re-execution now fails at its first step, saying so, and plays nothing."""
    from interrupted_nightly import nightly_job
    two = tmp_path / "two.jsonl"
    write_cases(two, [c.data for c in read_cases(EVAL)[:2]])
    with dg.instance_for_test() as instance:
        with dg.execute_job(dg.reconstructable(nightly_job), instance,
                            run_config=nightly_run_config(cases_file=str(two), agents=["naive"])) as first:
            assert first.success
            parent = first.run_id
        with dg.execute_job(dg.reconstructable(nightly_job), instance, raise_on_error=False,
                            reexecution_options=dg.ReexecutionOptions(parent_run_id=parent)) as again:
            assert not again.success
            [failure] = [e for e in again.all_events if e.event_type_value == "STEP_FAILURE"]
            assert failure.step_key == "scoreboard.plan_nightly"
            assert f"night {parent} completed" in failure.event_specific_data.error.message
    store = RunStore()
    assert len(store.episodes()) == 2 and len(store.nightly_history()) == 1
    assert [m["run_id"] for m in store.manifests()] == [parent]
    assert main(["verify"]) == 0 and "every check holds" in capsys.readouterr().out
