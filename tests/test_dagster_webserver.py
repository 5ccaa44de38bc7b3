"""A real dagster-webserver over workspace.yaml: its GraphQL API lists gate's assets and the cases; `dg dev`
from a clone in a folder of any name serves the code location `gate`."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.dagster_defs.partitions import sync_case_partitions
from gate_pipeline.dagster_defs.webserver import (
    free_port,
    graphql,
    stop_process_group,
    wait_until_serving,
    webserver,
)
from gate_pipeline.kernel.cases import read_cases

ROOT = Path(__file__).resolve().parents[1]

QUERY = """{ assetNodes { assetKey { path } groupName
  partitionDefinition { dimensionTypes { dynamicPartitionsDefinitionName } }
  partitionKeysByDimension { partitionKeys } } }"""


def test_webserver_serves_assets_and_case_partitions(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        added, _, problems = sync_case_partitions(instance, ROOT / "cases")
    assert not problems
    case_ids = [c.case_id for f in sorted((ROOT / "cases").rglob("*.jsonl")) for c in read_cases(f)]
    assert added == case_ids
    env = {"GATE_HOME": str(tmp_path / "gate"), "GATE_CASES_DIR": str(ROOT / "cases")}
    with webserver(ROOT, home, env=env) as base:
        assert base.startswith("http://127.0.0.1:")
        nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(base, QUERY)["assetNodes"]}
    assert set(nodes) == {"staging_batches", "wh_customers", "wh_orders", "revenue_mart", "agent_report",
                          "scoreboard"}
    for key in ("staging_batches", "wh_orders", "agent_report"):
        node = nodes[key]
        assert node["groupName"] == "gate_case"
        assert node["partitionDefinition"]["dimensionTypes"][0]["dynamicPartitionsDefinitionName"] == "cases"
        assert node["partitionKeysByDimension"][0]["partitionKeys"] == case_ids
    assert nodes["scoreboard"]["groupName"] == "gate_nightly" and nodes["scoreboard"]["partitionDefinition"] is None


LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"""


@pytest.mark.slow
def test_dg_dev_names_the_code_location_gate_whatever_the_clones_folder_is_called(tmp_path):
    """`dg dev` names a project's code location after its folder unless [tool.dg.project] says otherwise:
    a clone in a folder called `main` (the project file and the package, linked) serves `gate`."""
    clone = tmp_path / "main"
    clone.mkdir()
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    (clone / "gate_pipeline").symlink_to(ROOT / "gate_pipeline")
    port = free_port()
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "GATE_HOME": str(tmp_path / "gate"), "GATE_CASES_DIR": str(ROOT / "cases")}
    env.pop("DAGSTER_HOME", None)
    with open(tmp_path / "dg.log", "wb") as log:
        proc = subprocess.Popen([str(bin_dir / "dg"), "dev", "--use-active-venv", "-p", str(port)], cwd=clone, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_until_serving(base, proc, 300), (tmp_path / "dg.log").read_text()[-2000:]
        deadline = time.monotonic() + 120
        while (entries := graphql(base, LOCATIONS)["workspaceOrError"]["locationEntries"])[0]["loadStatus"] != "LOADED":
            assert time.monotonic() < deadline, entries
            time.sleep(1)
        assert entries == [{"name": "gate", "loadStatus": "LOADED"}]
    finally:
        stop_process_group(proc, first=signal.SIGINT)
    # what docs/dagster.md says `dg dev` gives up: a temporary instance, removed on exit, with no run monitoring
    log = (tmp_path / "dg.log").read_text(errors="replace")
    assert "for storage. This will be removed when dagster dev exits." in log
    [daemons] = [line for line in log.splitlines() if "Instance is configured with the following daemons" in line]
    assert "MonitoringDaemon" not in daemons
