"""A third suite defined inside tests/ (`mini_suite`: one family, one table, six tools) plays through `gate
report`, the gymnasium env, `gate serve` and a Dagster case run, with nothing changed outside its folder:
it is registered as any outside suite is, by GATE_SUITES (or `suites.register`)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mini_suite
import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play, prepare
from gate_pipeline.kernel.suite import suites

TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": str(TESTS), "GATE_SUITES": "mini_suite:SUITE"}


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """The mini suite registered in this process, and its case files under a cases directory of their own."""
    suites.register(mini_suite.SUITE)
    root = tmp_path_factory.mktemp("mini-cases")
    mini_suite.generate(root / "mini")
    try:
        yield root
    finally:
        suites.unregister("mini")


def engine_grades(path: Path) -> dict[str, dict]:
    return {c.case_id: play(prepare(c), "mini-careful").grade.as_dict() for c in read_cases(path)}


def test_gate_report_plays_the_third_suite_with_its_own_baselines(mini, capsys):
    path = mini / "mini" / "eval_curated.jsonl"
    assert main(["report", "--cases", str(path), "--json"]) == 0
    agents = json.loads(capsys.readouterr().out)["agents"]
    assert list(agents) == ["naive", "mini-careful", "refuse-all"]  # the suite's report agents
    assert [g["reward"] for g in agents["mini-careful"]] == [1.0] * 4
    assert all(g["reward"] < 1.0 for g in agents["naive"]) and all(g["suite"] == "mini" for g in agents["naive"])
    assert {g["case_id"]: g for g in agents["mini-careful"]} == engine_grades(path)
    assert main(["attacks", "--cases", str(path)]) == 0
    assert "mini-careful (target)" in capsys.readouterr().out


def test_the_gymnasium_env_plays_it_with_one_tool_less(mini):
    from gate_pipeline.integrations.gymnasium_env import GateEnv
    path = mini / "mini" / "eval_curated.jsonl"
    env = GateEnv(cases=str(path))
    for case in read_cases(path):
        _, info = env.reset(options={"case_id": case.case_id})
        assert sorted(json.loads(info["tools"])) == sorted(t.name for t in mini_suite.TOOLS) and "profile_batch" not in json.loads(info["tools"])
        obs, *_ = env.step(json.dumps({"tool": "profile_batch", "args": {"batch_id": case.batches[0].batch_id}}))
        assert "unknown tool 'profile_batch'" in json.loads(obs["result"])["error"]
        obs, *_ = env.step('{"tool": "list_batches"}')
        loaded, quarantined = [], []
        for b in json.loads(obs["result"]):
            obs, *_ = env.step(json.dumps({"tool": "run_sql", "args": {
                "query": f"SELECT COUNT(*) FROM {b['staging_table']} WHERE TRIM(value) = ''"}}))
            if json.loads(obs["result"])["rows"][0][0]:
                env.step(json.dumps({"tool": "quarantine_batch", "args": {
                    "batch_id": b["batch_id"], "column": "value", "defect_type": "missing_value"}}))
                quarantined.append(b["batch_id"])
            else:
                env.step(json.dumps({"tool": "load_batch", "args": {"batch_id": b["batch_id"]}}))
                loaded.append(b["batch_id"])
        *_, terminated, _, info = env.step(json.dumps({"tool": "submit_report",
                                                       "args": {"loaded": loaded, "quarantined": quarantined}}))
        assert terminated and json.loads(info["grade"])["reward"] == 1.0 and json.loads(info["grade"])["suite"] == "mini"


@pytest.mark.slow
def test_gate_serve_plays_it_over_the_wire(mini):
    pytest.importorskip("openenv")
    from servers import start_server, stop_server

    from gate_pipeline.integrations.openenv_client import GateEnvClient
    path = mini / "mini" / "eval_curated.jsonl"
    want = engine_grades(path)
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        proc, url, err = start_server("--cases", str(path), "--trainer-state")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)

    async def episode(case_id: str) -> dict:
        async with GateEnvClient(base_url=url) as env:
            await env.reset(case_id=case_id)
            batches = json.loads((await env.call("list_batches")).observation.result)
            loaded, quarantined = [], []
            await env.call("read_contract")
            for b in batches:
                blanks = json.loads((await env.call("run_sql", query=f"SELECT COUNT(*) FROM {b['staging_table']} "
                                                                       "WHERE TRIM(value) = ''")).observation.result)
                if blanks["rows"][0][0]:
                    await env.call("quarantine_batch", batch_id=b["batch_id"], column="value", defect_type="missing_value")
                    quarantined.append(b["batch_id"])
                else:
                    await env.call("load_batch", batch_id=b["batch_id"])
                    loaded.append(b["batch_id"])
            await env.call("submit_report", loaded=loaded, quarantined=quarantined)
            return (await env.state()).grade

    try:
        for case_id, grade in want.items():
            assert asyncio.run(episode(case_id)) == grade
    finally:
        assert stop_server(proc) == 0, "".join(err)[-2000:]


@pytest.mark.slow
def test_a_dagster_case_run_plays_it(mini, tmp_path):
    """In a fresh process that registers the suite through GATE_SUITES, as a code location would."""
    case = read_cases(mini / "mini" / "eval_curated.jsonl")[1]
    want = play(prepare(case), "mini-careful").grade.as_dict()
    script = textwrap.dedent(f"""
        import json
        import dagster as dg
        from gate_pipeline.dagster_defs.definitions import defs
        from gate_pipeline.dagster_defs.jobs import play_case_run_config
        from gate_pipeline.dagster_defs.partitions import cases_partitions
        from gate_pipeline.kernel.grading import grade_stored
        from gate_pipeline.kernel.settings import Settings
        from gate_pipeline.store import RunStore
        with dg.DagsterInstance.ephemeral() as instance:
            instance.add_dynamic_partitions(cases_partitions.name, [{case.case_id!r}])
            run = defs.resolve_job_def("play_case").execute_in_process(
                instance=instance, partition_key={case.case_id!r}, run_config=play_case_run_config("mini-careful"))
            store = RunStore(Settings.from_env())
            [episode] = store.episodes(run_id=run.run_id)
            print(json.dumps({{"success": run.success, "grade": grade_stored(store.load(episode["episode_id"])).as_dict()}}))
    """)
    env = {**os.environ, **ENV, "GATE_CASES_DIR": str(mini), "GATE_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["success"] and got["grade"] == want
