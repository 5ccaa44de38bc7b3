"""The model agent selected in the Dagster pipeline's run config, playing against the scripted server."""
from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from scripted_server import ScriptedServer

from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.jobs import play_case_run_config
from gate_pipeline.dagster_defs.partitions import cases_partitions
from gate_pipeline.dagster_defs.resources import CaseLibrary, GateStore
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
CASE = "eval-dimension-fanout-0"


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def instance(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.setenv("GATE_CASES_DIR", str(ROOT / "cases"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    with dg.DagsterInstance.ephemeral() as inst:
        inst.add_dynamic_partitions(cases_partitions.name, [c.case_id for c in read_cases(EVAL)])
        yield inst


def play(instance, options):
    return defs.resolve_job_def("play_case").execute_in_process(
        instance=instance, partition_key=CASE, run_config=play_case_run_config("model", options),
        raise_on_error=False)


def grade_events(instance) -> list:
    context = dg.build_sensor_context(instance=instance,
                                      resources={"gate_store": GateStore(), "case_library": CaseLibrary()})
    return defs.resolve_sensor_def("grading_sensor").evaluate_tick(context).asset_events


def play_and_grade(instance, options):
    result = play(instance, options)
    [obs] = grade_events(instance)
    return result, obs


def test_the_model_agent_is_selectable_in_the_run_config(server, instance):
    result, obs = play_and_grade(instance, {"model": "scripted", "base_url": server.url})
    assert result.success and obs.metadata["scripted/reward"].value == 1.0  # keyed by the agent: a model agent
    assert obs.tags["gate/agent"] == "scripted"                              # is named by its model
    latest = RunStore().latest_grades(CASE)
    assert list(latest) == ["scripted"] and latest["scripted"]["reward"] == 1.0


def test_an_unfinished_model_rollout_fails_the_step_with_the_reason(server, instance):
    result, obs = play_and_grade(instance, {"model": "silent", "base_url": server.url, "max_turns": 2})
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "max_turns: no report after 2 turns" in failure.event_specific_data.error.message
    assert obs.metadata["silent/reward"].value == 0.0
    assert "max_turns: no report after 2 turns" in obs.metadata["silent/reason"].value


def test_bad_model_options_fail_the_run_clearly(server, instance):
    result = play(instance, {"model": "scripted"})
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "needs options model and base_url" in failure.event_specific_data.error.message
    assert RunStore().episodes() == []  # nothing played, nothing stored
    assert grade_events(instance) == []
