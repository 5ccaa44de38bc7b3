"""Rollouts/s of `gate run`'s engine at concurrency 1, 8 and 32, against the scripted server answering at once.

The scripted chat-completions server (tests/scripted_server.py, careful policy, 4 requests per
two-batch case) runs in its own process, as a model server would. For each concurrency the
eval cases are played R times each through run_rollouts (the code `gate run` uses: the openai
client, transcripts written to disk, grades), and the script prints rollouts/s plus where the
CPU went: this process (HTTP client, JSON, transcripts, gate's episode work) and the server
process. "(gate ms)" is the time spent in gate's own episode work, tool calls and grading: it is
synchronous, so it is CPU time plus any wait for a CPU on a busy machine.

With --repeat N each concurrency is run N times (a fresh run each time) and the best and median
rollouts/s are printed after the rows: the machine may be shared, so one run is one sample.

    .venv/bin/python benchmarks/bench_rollouts.py [--rollouts R] [--concurrency 1,8,32] [--repeat N]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate_pipeline.cases import read_cases  # noqa: E402
from gate_pipeline.model_agent.agent import ModelSettings  # noqa: E402
from gate_pipeline.model_agent.rollouts import run_rollouts  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def measure(server_pid: int, cases: list[dict], settings: ModelSettings, rollouts: int, concurrency: int,
            run_dir: Path) -> float:
    """One fresh run: print its row, return its rollouts/s."""
    u0, s0 = own_cpu()
    srv0 = server_cpu(server_pid)
    t0 = time.perf_counter()
    out = asyncio.run(run_rollouts(cases, settings, rollouts, concurrency, run_dir))
    wall = time.perf_counter() - t0
    u1, s1 = own_cpu()
    records = out["records"]
    n = len(records)
    assert n == len(cases) * rollouts and all(r["reward"] == 1.0 for r in records)
    requests = sum(r["turns"] for r in records)
    gate_ms = sum(r["timings"]["tool_seconds"] + r["timings"]["grade_seconds"] for r in records) / n * 1e3
    print(f"{concurrency:>11}{n:>10}{wall:>9.2f}{n / wall:>12.1f}{requests / wall:>12.1f}"
          f"{(u1 - u0 + s1 - s0) / n * 1e3:>11.2f}{gate_ms:>11.2f}"
          f"{(server_cpu(server_pid) - srv0) / n * 1e3:>11.2f}", flush=True)
    return n / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=8, help="rollouts per eval case (32 cases)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--repeat", type=int, default=1, help="runs per concurrency (best and median printed)")
    p.add_argument("--server", choices=["asyncio", "threads"], default="asyncio",
                   help="the scripted server on one asyncio thread (default) or a thread per connection")
    a = p.parse_args()
    cases = read_cases(ROOT / "cases" / "classic" / "eval_curated.jsonl")
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripted_server.py"),
                               *(["--asyncio"] if a.server == "asyncio" else [])],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        settings = ModelSettings(model="careful", base_url=url)
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(run_rollouts(cases, settings, 1, 8, Path(tmp) / "warm-up"))
            print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} before the runs; "
                  f"{len(cases)} cases x {a.rollouts} rollouts per concurrency; {a.server} server")
            print(f"{'concurrency':>11}{'rollouts':>10}{'seconds':>9}{'rollouts/s':>12}{'requests/s':>12}"
                  f"{'client ms':>11}{'(gate ms)':>11}{'server ms':>11}   (CPU per rollout)")
            rates: dict[int, list[float]] = {}
            for c in [int(x) for x in a.concurrency.split(",")]:
                for run in range(max(1, a.repeat)):
                    rates.setdefault(c, []).append(
                        measure(server.pid, cases, settings, a.rollouts, c, Path(tmp) / f"c{c}-{run}"))
            if a.repeat > 1:
                for c, seen in rates.items():
                    print(f"concurrency {c}: best {max(seen):.1f} rollouts/s, median {statistics.median(seen):.1f} "
                          f"over {len(seen)} runs")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
