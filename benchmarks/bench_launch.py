"""Launch cost through the queued run coordinator and the daemon, as the UI's Materialize button.

One Dagster stack (`dagster dev`: webserver, daemon, code servers) on gate's instance config
serves two code locations: gate's, and a trivial one-op asset (benchmarks/launch/). Each round
launches, over GraphQL, one case of `play_case` (careful on a classic eval case) and one
materialization of the trivial asset, alternating which goes first, one at a time, and takes
Dagster's own timestamps: created -> started (queue, dequeue, run worker start) and started ->
ended (steps). Prints the medians and the ratio of launch-to-success, gate's case over the
trivial asset (goal: at most 1.5). Run from the repository root:
    .venv/bin/python benchmarks/bench_launch.py [--rounds 8]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gate_pipeline.dagster_defs.instance import prepare_instance_dir  # noqa: E402
from gate_pipeline.dagster_defs.webserver import (  # noqa: E402
    free_port,
    graphql,
    launch_run,
    stop_process_group,
    wait_for_run,
    wait_until_serving,
)

GOAL = 1.5
CASES = ["eval-clean-control-0", "eval-amount-bounds-1", "eval-orphan-customer-0", "eval-resent-rows-2"]
WORKSPACE = f"""load_from:
  - python_module:
      module_name: gate_pipeline.dagster_defs.definitions
      attribute: defs
      location_name: gate
  - python_file:
      relative_path: {ROOT / "benchmarks" / "launch" / "trivial_location.py"}
      location_name: trivial
"""
ADD_PARTITION = """mutation($key: String!) { addDynamicPartition(partitionsDefName: "cases", partitionKey: $key,
  repositorySelector: {repositoryLocationName: "gate", repositoryName: "__repository__"}) { __typename } }"""
TIMES = """query($id: ID!) { runOrError(runId: $id) { ... on Run { creationTime startTime endTime } } }"""


def timings(base: str, run_id: str) -> tuple[float, float]:
    run = graphql(base, TIMES, {"id": run_id})["runOrError"]
    return run["startTime"] - run["creationTime"], run["endTime"] - run["startTime"]


def launch(base: str, which: str, i: int) -> tuple[float, float]:
    if which == "gate":
        run_id = launch_run(base, "play_case", tags={"dagster/partition": CASES[i % len(CASES)]})
    else:
        run_id = launch_run(base, "__ASSET_JOB", location="trivial")
    status = wait_for_run(base, run_id, timeout=600, poll=0.1)
    if status != "SUCCESS":
        raise SystemExit(f"{which} run {run_id} ended {status}")
    return timings(base, run_id)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "dagster"
        prepare_instance_dir(home)
        (Path(tmp) / "workspace.yaml").write_text(WORKSPACE)
        env = {**os.environ, "DAGSTER_HOME": str(home), "GATE_HOME": str(Path(tmp) / "gate"),
               "GATE_CASES_DIR": str(ROOT / "cases"), "PYTHONWARNINGS": "ignore"}
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        exe = str(Path(sys.executable).parent / "dagster")
        with open(Path(tmp) / "dagster.log", "wb") as log:
            proc = subprocess.Popen([exe, "dev", "-w", str(Path(tmp) / "workspace.yaml"), "-h", "127.0.0.1",
                                     "-p", str(port)], env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            if not wait_until_serving(base, proc, 300):
                raise SystemExit(f"dagster dev exited {proc.returncode}")
            for case in CASES:  # as `gate ui` registers them before the UI opens
                graphql(base, ADD_PARTITION, {"key": case})
            launch(base, "trivial", 0), launch(base, "gate", 0)  # warm-up: code servers loaded, first-run setup
            got: dict[str, list[tuple[float, float]]] = {"gate": [], "trivial": []}
            for i in range(a.rounds):
                order = ("gate", "trivial") if i % 2 == 0 else ("trivial", "gate")
                for which in order:
                    got[which].append(launch(base, which, i))
        finally:
            stop_process_group(proc)
    print(f"launch to success over the queued run coordinator and daemon, {a.rounds} runs each (median s):")
    print(f"{'':22}{'created->started':>18}{'started->ended':>16}{'total':>8}")
    totals = {}
    for which, label in (("trivial", "trivial one-op asset"), ("gate", "gate case (careful)")):
        queue = statistics.median(t[0] for t in got[which])
        steps = statistics.median(t[1] for t in got[which])
        totals[which] = statistics.median(t[0] + t[1] for t in got[which])
        print(f"{label:22}{queue:18.2f}{steps:16.2f}{totals[which]:8.2f}")
    ratio = totals["gate"] / totals["trivial"]
    print(f"ratio gate case / trivial asset: {ratio:.2f}x (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'missed'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
