"""A case partition played in Dagster, graded by the sensor from the stored run."""
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.dagster_defs.checks import CHECK_NAME
from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.jobs import nightly_run_config, play_case_run_config
from gate_pipeline.dagster_defs.partitions import cases_partitions, sync_case_partitions
from gate_pipeline.dagster_defs.resources import CaseLibrary, GateStore
from gate_pipeline.kernel.cases import read_cases, write_cases
from gate_pipeline.kernel.engine import EpisodeStart, play, prepare
from gate_pipeline.kernel.grading import grade_stored
from gate_pipeline.kernel.records import GRADE_KEYS
from gate_pipeline.store import RunStore
from gate_pipeline.suites.classic.contract import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("error::DeprecationWarning")
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
CORE_KEYS = ("case_id", "family", *GRADE_KEYS, "revenue", "correct_revenue")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.setenv("GATE_CASES_DIR", str(ROOT / "cases"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    return tmp_path / "gate"


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        inst.add_dynamic_partitions(cases_partitions.name, [c.case_id for c in read_cases(EVAL)])
        yield inst


def case(case_id):
    return next(c for c in read_cases(EVAL) if c.case_id == case_id)


def run_case(instance, case_id, agent, **options):
    return defs.resolve_job_def("play_case").execute_in_process(
        instance=instance, partition_key=case_id, run_config=play_case_run_config(agent, options),
        raise_on_error=False)


def open_episode(store, case_id, agent, run_id):
    """A stored episode that was started and never ended (its process died): its id."""
    episode_id = uuid.uuid4().hex
    store.start_episode(EpisodeStart(episode_id, case(case_id), agent, {}, run_id, 0, time.time()))
    assert store.episode(episode_id)["status"] == "running"
    return episode_id


def fields(obs) -> dict:
    """A grade observation's own keys without the agent (`careful/reward` -> `reward`): reward, reason,
    episode_id, run; and nothing of it unkeyed, so a partition's page keeps `agent` the materializer's."""
    prefix = obs.tags["gate/agent"] + "/"
    assert set(obs.metadata) == {prefix + k for k in ("reward", "reason", "episode_id", "run")} | {
        "latest_grade_by_agent"}
    return {k[len(prefix):]: v.value for k, v in obs.metadata.items() if k.startswith(prefix)}


def tick(instance, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"gate_store": GateStore(), "case_library": CaseLibrary()})
    return defs.resolve_sensor_def("grading_sensor").evaluate_tick(context)


@pytest.mark.parametrize("case_id", ["eval-amount-bounds-2", "eval-orphan-customer-0"])
def test_careful_partition_grades_as_the_core(home, instance, case_id):
    result = run_case(instance, case_id, "careful")
    assert result.success
    data = tick(instance)
    [obs] = data.asset_events
    assert obs.asset_key == dg.AssetKey("agent_report") and obs.partition == case_id
    stored = RunStore().latest_grades(case_id)["careful"]
    core = play(prepare(case(case_id)), "careful").grade.as_dict()
    assert set(CORE_KEYS) <= set(core)
    got = fields(obs)
    assert stored.pop("agent") == "careful" and stored.pop("episode_id") == got["episode_id"]
    assert stored.pop("run_id") == result.run_id and got["run"] == result.run_id  # a link to the run
    assert stored == core
    assert got["reward"] == core["reward"] == 1.0 and got["reason"] == ""
    assert "| careful | 1.0000 | 1.0000 | 1.0000 | 1.0000 | 1.0000 | 0 | 0.00 | True |  |" in \
        obs.metadata["latest_grade_by_agent"].value


def test_bridge_observes_each_load_and_the_tables_materialize_once(home, instance):
    case_id = "eval-orphan-customer-0"
    result = run_case(instance, case_id, "naive")
    observed = [e.event_specific_data.asset_observation for e in result.all_events
                if e.event_type_value == "ASSET_OBSERVATION"]
    loads = [o for o in observed if o.asset_key.path[0] in ("wh_customers", "wh_orders")]
    [episode] = RunStore().episodes(run_id=result.run_id)
    ledger_loads = [e for e in RunStore().entries(episode["episode_id"]) if e["action"] == "load_batch"]
    assert len(loads) == len(ledger_loads) == len(case(case_id).batches)
    assert all(o.partition == case_id and all(k.startswith("naive/") for k in o.metadata) for o in observed)
    assert [o.metadata["naive/ledger_hash"].value for o in loads] == [e["hash"] for e in ledger_loads]
    # each load's table size: the seed warehouse's rows plus every row loaded into that table so far
    sizes = {t: len(rows) for t, rows in case(case_id).data["warehouse"].items()}
    for o, e in zip(loads, ledger_loads):
        table = o.asset_key.path[0].removeprefix("wh_")
        sizes[table] += e["args"]["rows"]
        assert o.metadata["naive/rows_loaded"].value == e["args"]["rows"]
        assert o.metadata["naive/table_rows"].value == sizes[table], o.metadata["naive/batch_id"].value
    mats = {e.event_specific_data.materialization.asset_key.path[0]: e.event_specific_data.materialization
            for e in result.get_asset_materialization_events()}
    assert set(mats) == {"staging_batches", "wh_customers", "wh_orders", "revenue_mart", "agent_report"}
    for table in ("customers", "orders"):  # materialized once, as the agent left them, with table metadata
        m = mats[f"wh_{table}"]
        assert m.partition == case_id and m.metadata["dagster/row_count"].value == sizes[table]
        assert m.metadata["dagster/table_name"].value == f"wh_{table}"
        assert [c.name for c in m.metadata["dagster/column_schema"].value.columns] == list(COLUMNS[table])
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == CHECK_NAME and check.partition == case_id
    assert mats["revenue_mart"].metadata["revenue_gap"].value != 0  # naive loaded the orphans
    assert instance.get_run_by_id(result.run_id).tags["gate/agent"] == "naive"


def test_contract_check_names_the_failing_column_and_value(home, instance):
    result = run_case(instance, "eval-amount-bounds-2", "refuse-all")
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and check.partition == "eval-amount-bounds-2"
    assert check.metadata["batches_failing"].value == 1 and check.metadata["case_id"].value == "eval-amount-bounds-2"
    failures = check.metadata["failures"].value
    [row] = [line for line in failures.splitlines() if "out_of_range" in line]
    cells = [c.strip() for c in row.strip("|").split("|")]
    bad = next(b for b in case("eval-amount-bounds-2").batches if b.defective)
    value = bad.data["rows"][int(cells[2])]["amount"]
    assert cells[1:] == ["out_of_range", cells[2], "amount", value] and float(value) > 50000
    # staging is described from the case, never written under GATE_HOME: only the run store is there
    assert not (home / "cases").exists()
    assert {p.name for p in home.iterdir()} <= {"runs.db", "runs.db-wal", "runs.db-shm", "warehouses", "store.key"}


def test_contract_check_flags_exactly_the_defective_batches():
    for c in read_cases(EVAL):
        prepared = prepare(c)
        flagged = {found.batch_id for found in prepared.suite.findings(prepared) if found.rules}
        assert flagged == {bid for bid, t in prepared.truth.items() if t["defective"]}, c.case_id


def test_sensor_grades_a_finished_run_exactly_once(home, instance):
    run_case(instance, "eval-clean-control-0", "careful")
    run_case(instance, "eval-clean-control-0", "naive")  # another agent: its own run, its own grade
    first = tick(instance)
    assert len(first.asset_events) == 2 and first.cursor.startswith("2 · careful on eval-clean-control-0 1.0000, ")
    assert first.skip_message == f"recorded 2 grades: {first.cursor.split(' · ', 1)[1]}"  # the tick's message
    again = tick(instance, cursor=first.cursor)
    assert again.asset_events == [] and again.skip_message == "no new grades" and again.cursor == "2"
    # a restart: a new store object over the same files, and the cursor Dagster kept
    store = RunStore()
    assert store.ungraded() == []
    assert tick(instance, cursor=first.cursor).asset_events == []
    graded = {fields(e)["episode_id"] for e in first.asset_events}
    assert graded == {ep["episode_id"] for ep in store.episodes()}
    for episode_id in graded:
        ep = store.episode(episode_id)
        assert store.grade_count(episode_id) == 1
        assert not store.add_grade(episode_id, ep["agent"], grade_stored(store.load(episode_id)))
        assert store.grade_count(episode_id) == 1
    latest = first.asset_events[1].metadata["latest_grade_by_agent"].value
    assert "| careful |" in latest and "| naive |" in latest


@pytest.fixture(scope="module")
def server():
    from scripted_server import ScriptedServer
    with ScriptedServer() as s:
        yield s


def failing_run(instance, case_id, server):
    """A run whose agent fails after it reported: a model whose server answers garbage at turn 1."""
    return run_case(instance, case_id, "model", model="garbage", base_url=server.url, retries=0)


def test_an_agent_that_fails_is_graded_zero_with_the_reason(home, instance, server):
    result = failing_run(instance, "eval-clean-control-1", server)
    assert not result.success
    [obs] = tick(instance).asset_events
    got = fields(obs)
    assert got["reward"] == 0.0
    assert "api_error" in got["reason"] and "not a chat completion" in got["reason"]
    grade = RunStore().latest_grades("eval-clean-control-1")["garbage"]
    assert grade["reward"] == 0.0 and grade["failed"] is True
    assert all(grade[t] == 0.0 for t in ("disposition", "report", "evidence", "inspected"))
    [episode] = RunStore().episodes(run_id=result.run_id)
    assert episode["status"] == "ended" and episode["end_reason"] == "api_error"


def test_an_unknown_agent_is_refused_at_launch_and_nothing_runs_or_is_stored(home, instance):
    with pytest.raises(dg.DagsterInvalidConfigError, match="not in enum type AgentName got no-such-agent"):
        run_case(instance, "eval-clean-control-1", "no-such-agent")
    assert instance.get_runs() == []  # no run was created
    assert RunStore().episodes() == []  # no phantom episode, so no phantom leaderboard row
    data = tick(instance)
    assert data.asset_events == [] and data.skip_message


def test_agent_options_reach_the_agent(home, instance):
    result = run_case(instance, "eval-amount-bounds-0", "careful", without=["orders.amount.out_of_range"])
    assert result.success
    [obs] = tick(instance).asset_events
    assert fields(obs)["reward"] < 1.0
    assert RunStore().latest_grades("eval-amount-bounds-0")["careful"]["bad_batches_loaded"] >= 1  # the ablated
    # rule let the bad batch through


def test_abandoned_episode_is_closed_and_graded_zero(home, instance):
    result = run_case(instance, "eval-clean-control-2", "careful")
    assert result.success
    store = RunStore()
    episode_id = open_episode(store, "eval-clean-control-2", "careful", result.run_id)  # never ended: a crash
    data = tick(instance)
    grades = {g["episode_id"]: g for g in map(fields, data.asset_events)}
    assert len(grades) == 2  # the run's own episode, and the abandoned one
    assert grades[episode_id]["reward"] == 0.0
    assert grades[episode_id]["reason"] == "the Dagster run ended (SUCCESS) before the episode did"
    episode = store.episode(episode_id)
    assert episode["status"] == "ended" and episode["end_reason"] == "abandoned"


def test_partitions_follow_the_case_files(tmp_path):
    cases = read_cases(EVAL)[:3]
    root = tmp_path / "cases" / "mini"
    write_cases(root / "eval_mini.jsonl", cases)
    with dg.DagsterInstance.ephemeral() as inst:
        library = CaseLibrary(cases_dir=str(tmp_path / "cases"))
        context = dg.build_sensor_context(instance=inst, resources={"case_library": library})
        sensor = defs.resolve_sensor_def("case_partitions_sensor")
        [add] = sensor.evaluate_tick(context).dynamic_partitions_requests
        assert list(add.partition_keys) == [c.case_id for c in cases]
        sync_case_partitions(inst, tmp_path / "cases")
        write_cases(root / "eval_mini.jsonl", cases[:2])
        [delete] = sensor.evaluate_tick(context).dynamic_partitions_requests
        assert list(delete.partition_keys) == [cases[2].case_id]
        (root / "broken.jsonl").write_text("{not json\n")  # an unreadable file never deletes anything
        assert sensor.evaluate_tick(context).dynamic_partitions_requests == []


def test_failed_run_sensor_closes_the_runs_open_episodes(home, instance, server):
    result = failing_run(instance, "eval-clean-control-3", server)
    assert not result.success
    store = RunStore()
    episode_id = open_episode(store, "eval-clean-control-3", "careful", result.run_id)
    failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    context = dg.build_run_status_sensor_context(
        sensor_name="failed_run_sensor", dagster_event=failure, dagster_instance=instance,
        dagster_run=result.dagster_run, resources={"gate_store": GateStore()}).for_run_failure()
    defs.resolve_sensor_def("failed_run_sensor")(context)
    episode = store.episode(episode_id)
    assert episode["status"] == "ended" and episode["error"].startswith("the Dagster run failed: ")
    assert "Steps failed: ['agent_episode']" in episode["error"]  # Dagster's own failure message
    grades = {g["episode_id"]: g for g in map(fields, tick(instance).asset_events)}
    assert grades[episode_id]["reward"] == 0.0


V2_EVAL = ROOT / "cases" / "v2" / "eval_curated.jsonl"


def test_a_run_without_an_agent_plays_the_target_agent_of_the_partitions_suite(home):
    """The asset page's Materialize and a backfill launch with no run config: careful on a classic case,
    careful-v2 on a v2 case (the classic careful would let v2's bad batches through)."""
    v2 = read_cases(V2_EVAL)[0]
    with dg.DagsterInstance.ephemeral() as inst:
        inst.add_dynamic_partitions(cases_partitions.name, ["eval-amount-bounds-2", v2.case_id])
        job = defs.resolve_job_def("__ASSET_JOB")
        for case_id, target in (("eval-amount-bounds-2", "careful"), (v2.case_id, "careful-v2")):
            result = job.execute_in_process(instance=inst, partition_key=case_id, asset_selection=[
                dg.AssetKey(k) for k in ("staging_batches", "wh_customers", "wh_orders", "revenue_mart", "agent_report")])
            assert result.success
            assert inst.get_run_by_id(result.run_id).tags["gate/agent"] == target
            [episode] = RunStore().episodes(run_id=result.run_id)
            assert episode["agent"] == target
            report = next(e.event_specific_data.materialization for e in result.get_asset_materialization_events()
                          if e.event_specific_data.materialization.asset_key.path == ["agent_report"])
            assert report.metadata["agent"].value == target
        assert tick(inst).asset_events[1].metadata["careful-v2/reward"].value == 1.0


def test_a_later_nightly_never_hides_the_agent_that_materialized_a_partition(home, instance, tmp_path):
    """The partition page shows, per metadata key, the latest observation's value before the materialization's
    (Dagster's UI: AssetEventMetadataEntriesTable). A nightly observes no case partition (its episodes are
    one observation of the scoreboard per chunk), so `agent` stays the materializing agent's; the sensor's
    grade observations are keyed by agent."""
    case_id = "eval-amount-bounds-2"
    assert run_case(instance, case_id, "careful").success
    small = tmp_path / "one.jsonl"
    write_cases(small, [case(case_id)])
    nightly = defs.resolve_job_def("nightly_benchmark").execute_in_process(
        instance=instance, run_config=nightly_run_config(str(small), ["refuse-all"]))
    assert nightly.success
    observed = [e.event_specific_data.asset_observation for e in nightly.all_events
                if e.event_type_value == "ASSET_OBSERVATION"]
    assert [o.asset_key.path for o in observed] == [["scoreboard"]]  # no observation of a case partition
    [row] = [line for line in observed[0].metadata["played"].value.splitlines() if line.startswith(f"| {case_id} ")]
    assert "| refuse-all |" in row
    for asset in ("staging_batches", "agent_report"):
        latest = instance.get_latest_materialization_event(dg.AssetKey(asset))
        assert latest.run_id != nightly.run_id
        if asset == "agent_report":
            assert latest.asset_materialization.metadata["agent"].value == "careful"
    # the grades too: the sensor's observation of careful's and refuse-all's grades keep to their own keys
    grades = tick(instance).asset_events
    assert {e.tags["gate/agent"] for e in grades} == {"careful", "refuse-all"}
    assert all("agent" not in e.metadata for e in grades)
