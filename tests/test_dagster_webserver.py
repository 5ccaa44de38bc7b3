"""A real dagster-webserver over workspace.yaml: its GraphQL API lists gate's assets and the cases."""
from pathlib import Path

import dagster as dg

from gate_pipeline.dagster_defs.partitions import sync_case_partitions
from gate_pipeline.dagster_defs.webserver import graphql, webserver
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
