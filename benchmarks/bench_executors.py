"""Nightly wall time on three Dagster executors side by side: in process, multiprocess, Celery.

The nightly job over the 320 train cases x naive, careful, refuse-all (960 episodes), as
`nightly_benchmark` (every step in one process), `nightly_benchmark_multiprocess` (a process per
chunk, 2 at once) and `nightly_benchmark_celery` (a Redis broker and 2 `dagster-celery` workers,
one task at a time each). All three use the same PostgreSQL server, started on 127.0.0.1 for
this run (gate's run store and Dagster's storage), so the executor is the only difference; the
workers have a GATE_HOME and DAGSTER_HOME of their own, as other machines would.

Each executor first plays a warm-up night of 8 cases (not timed: imports, Dagster's tables, the
workers' first task). Then each round times the three, in a rotated order, from launch until the
run has ended; the ratios are each executor's time over in process's in the same round (the
machine is shared and its speed moves: read the ratios). Every timed scoreboard must equal the
in-process one (grades, summary and tables), else the exit status is 1.

Run from the repository root (the `postgres` and `celery` extras, Debian's postgresql and
redis-server): .venv/bin/python benchmarks/bench_executors.py [--rounds 3] [--chunk-size 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/servers.py: PostgreSQL, Redis and Celery workers
sys.path.insert(0, str(ROOT))

import dagster as dg
from servers import celery_workers, postgres, redis

from gate_pipeline.dagster_defs import definitions
from gate_pipeline.dagster_defs.instance import prepare_instance_dir
from gate_pipeline.dagster_defs.jobs import nightly_run_config
from gate_pipeline.kernel.cases import read_cases, write_cases
from gate_pipeline.store import RunStore

TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"
AGENTS = ["naive", "careful", "refuse-all"]
WORKERS = 2
KEY = "bench-executors-store-key-0123456789abcdef"


def nightly_job() -> dg.JobDefinition:
    return definitions.defs.resolve_job_def("nightly_benchmark")


EXECUTORS = {"in process": nightly_job, "multiprocess": definitions.nightly_multiprocess_job,
             "celery": definitions.nightly_celery_job}
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the same for all three


def run_night(job_fn, instance, config: dict) -> tuple[float, dict]:
    """Wall seconds from launch to the run's end, and the scoreboard it stored."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dagster-celery registers its task again for every step it sends
        with dg.execute_job(dg.reconstructable(job_fn), instance, run_config={**config, **QUIET}) as result:
            ok, run_id = result.success, result.run_id
    seconds = time.perf_counter() - t0
    if not ok:
        raise SystemExit(f"bench: the run {run_id} of {job_fn.__name__} failed")
    return seconds, json.loads(RunStore().get_output(run_id, "scoreboard.build_scoreboard", "result"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk-size", type=int, default=8,
                    help="cases per step (default 8; the job's own default picks it from the case count)")
    ap.add_argument("--cases", type=int, default=0, help="only the first N train cases (default: all 320)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-bench-executors-", ignore_cleanup_errors=True) as tmp:
        return bench(a, Path(tmp))


SAME = ("grades", "summary", "tables")


def bench(a: argparse.Namespace, work: Path) -> int:
    cases = read_cases(TRAIN)[:a.cases or None]
    night, warm = work / "cases.jsonl", work / "warm_up.jsonl"
    write_cases(night, cases)
    write_cases(warm, cases[:8])
    names = list(EXECUTORS)
    base, others = names[0], names[1:]
    print(f"nightly: {len(cases)} train cases x {', '.join(AGENTS)} = {len(cases) * len(AGENTS)} episodes, "
          f"chunks of {a.chunk_size} cases ({-(-len(cases) // a.chunk_size)} play steps); multiprocess: 2 "
          f"processes at once; celery: Redis, {WORKERS} workers of 1 process; PostgreSQL on 127.0.0.1 for all "
          f"three; {os.cpu_count()} CPUs", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the start", file=sys.stderr, flush=True)
    with postgres() as pg, redis() as broker:
        url = pg.create_database(f"gate_{uuid.uuid4().hex[:12]}")
        for name, value in {"GATE_HOME": str(work / "orchestrator"), "GATE_DB_URL": url, "GATE_STORE_KEY": KEY,
                            "GATE_CELERY_BROKER": broker}.items():
            os.environ[name] = value
        worker_env = {"GATE_DB_URL": url, "GATE_STORE_KEY": KEY, "GATE_HOME": str(work / "worker-home")}
        dagster_home = work / "dagster"
        prepare_instance_dir(dagster_home, url)
        with celery_workers(broker, WORKERS, work / "worker-dagster", env=worker_env, log_dir=work), \
                dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            for job_fn in EXECUTORS.values():
                run_night(job_fn, instance, nightly_run_config(str(warm), AGENTS, chunk_size=a.chunk_size))
            config = nightly_run_config(str(night), AGENTS, chunk_size=a.chunk_size)
            print("wall seconds from launch to the run's end; ratio: over in process's seconds in the same round; "
                  "same: the scoreboard (grades, summary, tables) equals in process's")
            print("round " + "".join(f"{n:>14}" for n in names) + "".join(f"{n + ' ratio':>20}" for n in others)
                  + "   same", flush=True)
            times: dict[str, list[float]] = {n: [] for n in names}
            same, reference = True, None
            for r in range(a.rounds):
                boards = {}
                for name in names[r % len(names):] + names[:r % len(names)]:
                    seconds, boards[name] = run_night(EXECUTORS[name], instance, config)
                    times[name].append(seconds)
                reference = reference or boards[base]
                equal = all(b[k] == reference[k] for b in boards.values() for k in SAME)
                same = same and equal
                print(f"{r + 1:>5} " + "".join(f"{times[n][r]:>12.1f} s" for n in names)
                      + "".join(f"{times[n][r] / times[base][r]:>20.2f}" for n in others)
                      + f"   {'yes' if equal else 'NO':>4}", flush=True)
                print(f"load average {os.getloadavg()[0]:.2f} after round {r + 1}", file=sys.stderr, flush=True)
    ratios = {n: statistics.median(t / b for t, b in zip(times[n], times[base], strict=True)) for n in others}
    print("median" + "".join(f"{statistics.median(times[n]):>12.1f} s" for n in names)
          + "".join(f"{ratios[n]:>20.2f}" for n in others))
    rewards = ", ".join(f"{agent} {s['reward']:.4f}" for agent, s in reference["summary"]["agents"].items())
    print(f"scoreboards equal on every executor in every round: {'yes' if same else 'NO'}; rewards: {rewards}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
