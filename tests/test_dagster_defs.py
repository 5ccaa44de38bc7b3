"""The code location loads cleanly (no deprecation warning of gate's making) and is complete."""
import subprocess
import sys

import dagster as dg

from gate_pipeline.dagster_defs.definitions import defs

LOAD = """
import warnings
warnings.simplefilter("error")
import dagster as dg
from gate_pipeline.dagster_defs.definitions import defs
dg.Definitions.validate_loadable(defs)
for name in ("play_case", "nightly_benchmark", "nightly_benchmark_multiprocess"):
    defs.resolve_job_def(name)
for name in ("grading_sensor", "failed_run_sensor", "case_partitions_sensor"):
    defs.resolve_sensor_def(name)
defs.resolve_schedule_def("nightly_benchmark_schedule")
print("loaded")
"""


def test_definitions_load_with_warnings_as_errors():
    out = subprocess.run([sys.executable, "-c", LOAD], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "loaded"


def test_assets_groups_kinds_and_checks():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {"staging_batches", "wh_customers", "wh_orders", "revenue_mart", "agent_report", "scoreboard"}
    for key in keys - {"scoreboard"}:
        node = graph.get(dg.AssetKey(key))
        assert node.group_name == "gate_case" and node.partitions_def.name == "cases", key
        assert node.description and node.kinds, key
    assert graph.get(dg.AssetKey("scoreboard")).partitions_def is None
    [check] = graph.asset_check_keys
    assert check.name == "contract" and check.asset_key == dg.AssetKey("staging_batches")
    assert defs.resolve_assets_def("staging_batches") is not None
    # the scoreboard summarises the case assets: every partition of agent_report feeds it
    assert {k.to_user_string() for k in graph.get(dg.AssetKey("scoreboard")).parent_keys} == {"agent_report"}
    upstream = {k.to_user_string() for k in graph.get(dg.AssetKey("revenue_mart")).parent_keys}
    assert upstream == {"wh_customers", "wh_orders"}
    # staging reads the case library only; playing needs the run store too
    def resources(key):  # Dagster adds its io_manager to every asset
        return defs.resolve_assets_def(key).required_resource_keys - {"io_manager"}
    assert resources("staging_batches") == {"case_library"}
    assert resources("revenue_mart") == {"case_library", "gate_store"}  # agent_episode's multi-asset


def test_schedule_is_0200_utc():
    schedule = defs.resolve_schedule_def("nightly_benchmark_schedule")
    assert schedule.cron_schedule == "0 2 * * *" and schedule.execution_timezone == "UTC"
    assert schedule.job_name == "nightly_benchmark"


def test_dg_project_points_at_the_definitions():
    import tomllib
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    dg_conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["dg"]
    assert dg_conf["directory_type"] == "project"
    assert dg_conf["project"]["code_location_target_module"] == "gate_pipeline.dagster_defs.definitions"
    assert dg_conf["project"]["defs_module"] == "gate_pipeline.dagster_defs"  # `dg check defs` needs it
    assert "gate_pipeline.dagster_defs.definitions" in (root / "workspace.yaml").read_text()


def test_the_catalog_says_who_owns_what_and_how_fresh_the_scoreboard_must_be():
    graph = defs.resolve_asset_graph()
    from gate_pipeline import __version__
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.owners == ["team:gate"] and node.code_version == __version__, key
        assert node.tags.get("layer"), key
    scoreboard = defs.resolve_assets_def("scoreboard").specs_by_key[dg.AssetKey("scoreboard")]
    assert scoreboard.freshness_policy.warn_window.to_timedelta().days == 1
    for name in ("play_case", "nightly_benchmark", "nightly_benchmark_multiprocess"):
        assert int(defs.resolve_job_def(name).tags["dagster/max_runtime"]) > 0
    assert defs.resolve_schedule_def("nightly_benchmark_schedule").tags["gate/cases"]


def test_run_config_names_only_agents_gate_knows():
    from gate_pipeline.dagster_defs.catalog import AgentName, known_agents
    names = [a.value for a in AgentName]
    assert names == known_agents() and {"careful", "naive", "model", "careful@full"} <= set(names)
