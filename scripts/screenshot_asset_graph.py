"""Screenshot gate's asset graph in the real Dagster UI with Debian's headless chromium.

A fresh DAGSTER_HOME and GATE_HOME in a temporary directory; the case partitions synced;
a few cases played (careful and naive) and graded by one tick of the grading sensor, whose
observations are reported to the instance as the daemon would; then dagster-webserver on
127.0.0.1 over workspace.yaml and `chromium --headless --screenshot` of the gate_case
lineage page. Writes docs/asset-graph.png. Run from the repository root:
    .venv/bin/python scripts/screenshot_asset_graph.py
(needs Debian's chromium: apt-get install -y chromium)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "asset-graph.png"
CASES = ["eval-amount-bounds-2", "eval-orphan-customer-0", "eval-clean-control-0"]
PAGE = "/locations/gate/asset-groups/gate_case/lineage"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--window-size=1600,900", "--virtual-time-budget=20000"]


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("screenshot: chromium not found (Debian: apt-get install -y chromium)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gate-shot-"))
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {"GATE_HOME": str(work / "gate"), "GATE_CASES_DIR": str(ROOT / "cases")}
    os.environ.update(env)

    import dagster as dg

    from gate_pipeline.dagster_defs.definitions import defs
    from gate_pipeline.dagster_defs.jobs import play_case_run_config
    from gate_pipeline.dagster_defs.partitions import sync_case_partitions
    from gate_pipeline.dagster_defs.resources import default_resources
    from gate_pipeline.dagster_defs.webserver import graphql, webserver

    with dg.DagsterInstance.from_config(str(home)) as instance:
        sync_case_partitions(instance, ROOT / "cases")
        job = defs.resolve_job_def("play_case")
        for case_id in CASES:
            for agent in ("naive", "careful"):
                job.execute_in_process(instance=instance, partition_key=case_id,
                                       run_config=play_case_run_config(agent), raise_on_error=False)
        context = dg.build_sensor_context(instance=instance, resources=default_resources())
        for event in defs.resolve_sensor_def("grading_sensor").evaluate_tick(context).asset_events:
            instance.report_runless_asset_event(event)

    with webserver(ROOT, home, env=env) as base:
        graphql(base, "mutation { setNuxSeen }")  # what the UI's "Skip" does on the first visit
        OUT.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'chromium'}",
                               f"--screenshot={OUT}", base + PAGE], capture_output=True, text=True, timeout=120)
    if shot.returncode != 0 or not OUT.is_file():
        print(f"screenshot: chromium failed ({shot.returncode}): {shot.stderr[-500:]}", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes) from {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
