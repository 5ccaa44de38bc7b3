"""Episodes per second for each baseline over the 320 train cases, on one core, in process.

An episode here is what `engine.play` does: a private copy of the case's prepared SQLite image,
the agent playing through the seven tools, the ledger hashed and the grade computed (the mart
read from the warehouse). Preparing each case (its image, profiles and correct mart) happens
once per case and is timed apart. The command-line figure, measured from outside and compared
with the classic implementation, is ../shared/bench/throughput's; this one shows the agents apart.

    .venv/bin/python benchmarks/bench_throughput.py [--cases FILE] [--repeats 3] [--agents a,b]
"""
from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate_pipeline.kernel.agents import resolve_agent  # noqa: E402
from gate_pipeline.kernel.cases import read_cases  # noqa: E402
from gate_pipeline.kernel.engine import play, prepare  # noqa: E402
from gate_pipeline.suites.classic import BASELINES  # noqa: E402


def calibration_ms() -> float:
    """A fixed pure-Python + SQLite workload, best of 5: how fast this machine is right now.

    The machine is a VM on a shared host whose speed moves by 2x from one minute to the next;
    printing this beside the figures lets two runs be compared (lower is faster)."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE t (a TEXT, b REAL)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(str(i), i * 0.5) for i in range(2000)])
        for i in range(200):
            conn.execute(f"SELECT a FROM t WHERE b > {i} GROUP BY a HAVING COUNT(*) > 1").fetchall()
        sum(len(str(i)) for i in range(100_000))
        conn.close()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=str(ROOT / "cases/classic/train_procedural.jsonl"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agents", default=",".join(BASELINES))
    a = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(os.environ.get("GATE_BENCH_CPU", sorted(os.sched_getaffinity(0))[-1]))})  # one core
    cases = read_cases(a.cases)
    t = time.perf_counter()
    prepared = [prepare(c) for c in cases]
    for p in prepared:
        _ = p.correct_mart
    prep_ms = (time.perf_counter() - t) / len(prepared) * 1e3
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, one core, "
          f"{len(cases)} cases from {Path(a.cases).name}")
    print(f"prepare once per case (image, profiles, correct mart): {prep_ms:.2f} ms/case")
    print(f"machine speed now: calibration workload {calibration_ms():.1f} ms (lower is faster)")
    print(f"{'agent':<14}{'episodes/s (best)':>19}{'median':>10}{'ms/episode':>12}")
    for name in a.agents.split(","):
        spec = resolve_agent(name)
        rates = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            for p in prepared:
                play(p, spec)
            rates.append(len(prepared) / (time.perf_counter() - t))
        best = max(rates)
        print(f"{name:<14}{best:>19.0f}{statistics.median(rates):>10.0f}{1e3 / best:>12.3f}")
    print(f"machine speed after: calibration workload {calibration_ms():.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
