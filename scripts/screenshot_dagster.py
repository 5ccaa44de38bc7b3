"""Screenshot gate in the real Dagster UI with Debian's headless chromium: the README's pictures.

A fresh DAGSTER_HOME (gate's instance config) and GATE_HOME in a temporary directory; the case
partitions synced; a few cases played (careful and naive), the nightly job run once, and one
tick of the grading sensor, whose observations are reported to the instance as the daemon
would; then dagster-webserver on 127.0.0.1 over workspace.yaml and `chromium --headless
--screenshot` of three pages (SHOTS). Writes docs/dagster-*.png. Run from the repository root:
    .venv/bin/python scripts/screenshot_dagster.py
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
CASES = ["eval-clean-control-0", "eval-orphan-customer-0", "eval-amount-bounds-2"]  # the last: the check page's
SHOTS = {  # file under docs/ -> page
    "dagster-asset-graph.png": "/assets/scoreboard?view=lineage&lineageScope=upstream&lineageDepth=5",
    "dagster-case-partition.png": f"/assets/staging_batches?view=partitions&partition={CASES[-1]}",
    "dagster-case-checks.png": "/assets/staging_batches?view=checks",
    "dagster-scoreboard.png": "/assets/scoreboard",
}
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
    env = {"GATE_HOME": str(work / "gate"), "GATE_CASES_DIR": str(ROOT / "cases")}
    os.environ.update(env)

    import dagster as dg

    from gate_pipeline.dagster_defs.definitions import defs
    from gate_pipeline.dagster_defs.instance import prepare_instance_dir
    from gate_pipeline.dagster_defs.jobs import nightly_run_config, play_case_run_config
    from gate_pipeline.dagster_defs.partitions import sync_case_partitions
    from gate_pipeline.dagster_defs.resources import default_resources
    from gate_pipeline.dagster_defs.webserver import graphql, webserver

    prepare_instance_dir(home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        sync_case_partitions(instance, ROOT / "cases")
        job = defs.resolve_job_def("play_case")
        for case_id in CASES:
            for agent in ("naive", "careful"):
                job.execute_in_process(instance=instance, partition_key=case_id,
                                       run_config=play_case_run_config(agent), raise_on_error=False)
        defs.resolve_job_def("nightly_benchmark").execute_in_process(instance=instance, run_config=nightly_run_config())
        context = dg.build_sensor_context(instance=instance, resources=default_resources())
        for event in defs.resolve_sensor_def("grading_sensor").evaluate_tick(context).asset_events:
            instance.report_runless_asset_event(event)

    with webserver(ROOT, home, env=env) as base:
        graphql(base, "mutation { setNuxSeen }")  # what the UI's "Skip" does on the first visit
        for name, page in SHOTS.items():
            out = ROOT / "docs" / name
            shot = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'chromium'}",
                                   f"--screenshot={out}", base + page], capture_output=True, text=True, timeout=120)
            if shot.returncode != 0 or not out.is_file():
                print(f"screenshot: chromium failed ({shot.returncode}): {shot.stderr[-500:]}", file=sys.stderr)
                return 1
            print(f"wrote docs/{name} ({out.stat().st_size} bytes) from {page}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
