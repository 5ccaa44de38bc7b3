"""Time the nightly benchmark job in process: 32 eval cases x naive, careful, refuse-all.

Prints the bare core (engine.play_cases: episodes in memory, graded), the same episodes
stored under GATE_HOME without Dagster (a StoreSink, then grading from the store), the
nightly job in process on an ephemeral instance, and `gate nightly` end to end (a fresh
process, imports included); then the Dagster overhead per case over the bare core. The
target is at most 15 s in total. With --multiprocess it also runs the job on Dagster's
multiprocess executor (one process per chunk of cases) and checks the scoreboard is the
same. Run from the repository root: .venv/bin/python benchmarks/bench_nightly.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
AGENTS = ["naive", "careful", "refuse-all"]
TARGET_S = 15.0


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--multiprocess", action="store_true", help="also run the multiprocess executor and compare")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    os.environ["GATE_HOME"] = str(work / "gate")

    t0 = time.perf_counter()
    import dagster as dg

    from gate_pipeline.dagster_defs import definitions
    from gate_pipeline.dagster_defs.jobs import nightly_run_config
    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import play_cases
    from gate_pipeline.kernel.grading import grade_stored
    from gate_pipeline.store import RunStore, StoreSink
    import_s = time.perf_counter() - t0

    cases = read_cases(EVAL)
    n = len(cases)
    core_s, _ = timed(lambda: play_cases(cases, AGENTS), a.repeats)

    def stored():
        store = RunStore()
        results = play_cases(cases, AGENTS, sinks=[StoreSink(store)])
        return [grade_stored(store.load(r.episode_id)) for rs in results.values() for r in rs]
    stored_s, _ = timed(stored, a.repeats)

    config = nightly_run_config(str(EVAL), AGENTS)
    job = definitions.defs.resolve_job_def("nightly_benchmark")

    def nightly():
        with dg.DagsterInstance.ephemeral() as instance:
            result = job.execute_in_process(instance=instance, run_config=config)
            return result.output_for_node("scoreboard")
    nightly_s, board = timed(nightly, a.repeats)

    t0 = time.perf_counter()
    cli = subprocess.run([str(Path(sys.executable).parent / "gate"), "nightly", "--cases", str(EVAL)],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ})
    cli_s = time.perf_counter() - t0
    if cli.returncode != 0:
        print(cli.stderr, file=sys.stderr)
        return 1

    per_case_ms = (nightly_s - core_s) / n * 1000
    print(f"nightly benchmark: {n} eval cases x {', '.join(AGENTS)} = {n * len(AGENTS)} episodes "
          f"(median of {a.repeats}; {os.cpu_count()} CPUs)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end", file=sys.stderr)
    print(f"  import dagster + gate definitions        {import_s:7.2f} s")
    print(f"  bare core (engine.play_cases)            {core_s:7.2f} s")
    print(f"  stored episodes, no Dagster (StoreSink)  {stored_s:7.2f} s")
    print(f"  nightly job in process (ephemeral)       {nightly_s:7.2f} s")
    print(f"  `gate nightly` end to end (new process)  {cli_s:7.2f} s   target <= {TARGET_S:.0f} s: "
          f"{'met' if cli_s <= TARGET_S else 'NOT met'}")
    print(f"  Dagster overhead over the bare core      {per_case_ms:7.1f} ms per case "
          f"({(nightly_s - stored_s) / n * 1000:.1f} ms of it Dagster itself, the rest the run store)")
    print(f"  scoreboard: careful {board['summary']['agents']['careful']['reward']:.4f}, "
          f"naive {board['summary']['agents']['naive']['reward']:.4f}, "
          f"refuse-all {board['summary']['agents']['refuse-all']['reward']:.4f}")

    if a.multiprocess:
        t0 = time.perf_counter()
        with dg.instance_for_test() as instance:
            with dg.execute_job(dg.reconstructable(definitions.nightly_multiprocess_job), instance=instance,
                                run_config=config) as result:
                steps = sorted({e.step_key for e in result.all_events if e.is_step_success})
                mat = next(e.event_specific_data.materialization for e in result.get_asset_materialization_events()
                           if e.event_specific_data.materialization.asset_key.path == ["scoreboard"])
        mp_s = time.perf_counter() - t0
        same = (mat.metadata["summary"].value == board["summary"]
                and mat.metadata["tables"].value.strip("`\n") == board["tables"])
        print(f"  multiprocess executor ({len(steps)} steps, max 2 at once)  {mp_s:7.2f} s   "
              f"same scoreboard as in process: {same}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
