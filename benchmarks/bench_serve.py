"""Load test of `gate serve`: N concurrent OpenEnv sessions playing careful-sql's episodes to the end.

Why: a trainer runs many rollouts at once against one server. For each session count, a fresh
`gate serve --port 0 --max-sessions N` is started on 127.0.0.1; careful-sql's actions on every
case are recorded in process first (through the engine), then N asyncio clients (`GateEnvClient`,
openenv-core's WebSocket client, all in this process) each play their share of `--episodes`
episodes, one step awaiting the next, and check every episode's grade (from `state()`) against
the in-process grade. Before timing, one session resets every case once so all cases are
prepared; memory per session is the server's RSS at its peak during the run minus its RSS
before the sessions opened, divided by N. Bounded: `--episodes` in all per run, and no new
episode starts after `--time-limit` seconds.

    .venv/bin/python benchmarks/bench_serve.py [--sessions 64,256,512] [--episodes 1024] [--cases FILE]
                                               [--noisy 8] [--noisy-sessions 64] [--burst 16]

The noisy-neighbours rows: N sessions play while K more sessions each run a query until the
sandbox's 2 s budget stops it, one after another, for the whole run, each such run right after a
quiet run of the same N sessions, R times; the playing sessions' p99 step latency is printed
beside the quiet runs' (the goal: at most twice it).

The burst row: K sessions of one client each send one query of about a second's work (a counting query sized
on the server by timing it alone), all at once; each must answer, none `interrupted`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from wire import recorded  # noqa: E402  (tests/wire.py: an agent's calls, recorded through the engine)

from gate_pipeline.integrations.openenv_client import GateAction, GateEnvClient  # noqa: E402
from gate_pipeline.integrations.openenv_server import GateServerEnv  # noqa: E402
from gate_pipeline.kernel.cases import Case, read_cases  # noqa: E402
from gate_pipeline.kernel.engine import Session  # noqa: E402
from gate_pipeline.kernel.pool import CasePool  # noqa: E402


def record(cases: list[Case]) -> dict[str, tuple[list, dict]]:
    """{case id: (careful-sql's calls, its grade)}, played in process by the engine."""
    return {case.case_id: recorded(case, "careful-sql") for case in cases}


def in_process(cases: list[Case], plays: dict, rounds: int = 3) -> tuple[float, float]:
    """CPU seconds per step of careful-sql's calls in this process (this thread's CPU time, the
    measure the server's column uses): through `GateServerEnv.step` (what the server runs per
    step, without the server) and through the engine's `Session.step` alone; the least of
    `rounds` rounds each."""
    pool = CasePool(cases)
    env = GateServerEnv(pool)
    steps = sum(len(actions) for actions, _ in plays.values())
    adapter = engine = float("inf")
    for _ in range(rounds):
        t = 0.0
        for case_id, (actions, _) in plays.items():
            env.reset(case_id=case_id)
            start = time.thread_time()
            for action in actions:
                env.step(GateAction(action=action))
            t += time.thread_time() - start
        adapter = min(adapter, t / steps)
        t = 0.0
        for case_id, (actions, _) in plays.items():
            session = Session(pool.prepared(case_id), "bench", stop_at_report=True, max_steps=64)
            start = time.thread_time()
            for action in actions:
                session.step(action)
            t += time.thread_time() - start
        engine = min(engine, t / steps)
    env.close()
    return adapter, engine


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """`gate serve` in a process group of its own, always stopped."""

    def __init__(self, cases_file: str, sessions: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gate_pipeline.cli.main", "serve", "--port", "0", "--cases", cases_file,
             "--max-sessions", str(sessions), "--trainer-state"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        try:
            first = lines.get(timeout=120)
        except queue.Empty:
            self.stop()
            raise SystemExit(f"gate serve did not start: {''.join(self.err)[-2000:]}") from None
        self.url = first.split(" on ", 1)[1].split(" ", 1)[0]

    def stop(self) -> int:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()
        except ProcessLookupError:
            return self.proc.wait()


class Peak:
    """The highest RSS of a process, sampled every 20 ms while running."""

    def __init__(self, pid: int):
        self.pid, self.kib, self._stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.kib = max(self.kib, proc_status(self.pid)["VmRSS"])
            self._stop.wait(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()
        self.kib = max(self.kib, proc_status(self.pid)["VmRSS"])


async def warm(url: str, case_ids: list[str]) -> None:
    """One session resets every case once: every case is prepared before timing, as in training."""
    async with GateEnvClient(base_url=url) as env:
        for case_id in case_ids:
            await env.reset(case_id=case_id)


async def session(url: str, episodes: list[str], plays: dict, clock: dict, out: dict, opened: asyncio.Barrier):
    """One client: open, wait for every other, then play its episodes to the end."""
    env = GateEnvClient(base_url=url, message_timeout_s=120)
    try:
        await env.connect()
    except Exception as exc:  # noqa: BLE001  (counted, not raised: a load test counts what fails)
        out["errors"].append(f"connect: {type(exc).__name__}: {exc}")
        await opened.wait()
        return
    await opened.wait()
    try:
        for case_id in episodes:
            if time.perf_counter() > clock["deadline"]:
                out["skipped"] += 1
                continue
            actions, want = plays[case_id]
            try:
                t = time.perf_counter()
                await env.reset(case_id=case_id)
                out["reset"].append(time.perf_counter() - t)
                for action in actions:
                    t = time.perf_counter()
                    result = await env.step(action)
                    out["step"].append(time.perf_counter() - t)
                state = await env.state()
            except Exception as exc:  # noqa: BLE001
                out["errors"].append(f"{case_id}: {type(exc).__name__}: {exc}")
                return
            out["episodes"] += 1
            if not result.done or state.grade != want:
                out["mismatches"].append(case_id)
    finally:
        await env.close()


# a query that runs until the sandbox's 2 s time budget stops it: string work inside each VM step
SLOW_QUERY = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c WHERE "
              f"instr(upper(lower(upper(substr('{'ab' * 4000}', x % 3)))), 'zz') > x")


async def hostile(url: str, case_id: str, stop: asyncio.Event, out: dict) -> None:
    """A policy that sends a query as long as the sandbox lets run, over and over, until told to stop."""
    action = {"tool": "run_sql", "args": {"query": SLOW_QUERY}}
    async with GateEnvClient(base_url=url, message_timeout_s=120) as env:
        await env.reset(case_id=case_id, max_turns=1024)
        while not stop.is_set():
            t = time.perf_counter()
            result = await env.step(action)
            out["slow"].append(time.perf_counter() - t)
            out["slow_interrupted"] += json.loads(result.observation.result) == {"error": "interrupted"}
            if result.done:
                await env.reset(case_id=case_id, max_turns=1024)


async def load(url: str, sessions: int, episodes: int, plays: dict, time_limit: float, slow: int = 0) -> dict:
    case_ids = list(plays)
    share = [[case_ids[(i + k * sessions) % len(case_ids)] for k in range(episodes // sessions + (i < episodes % sessions))]
             for i in range(sessions)]
    out = {"step": [], "reset": [], "errors": [], "mismatches": [], "episodes": 0, "skipped": 0, "slow": [],
           "slow_interrupted": 0}
    stop = asyncio.Event()
    slow_tasks = [asyncio.create_task(hostile(url, case_ids[0], stop, out)) for _ in range(slow)]
    opened = asyncio.Barrier(sessions + 1)
    clock = {"deadline": float("inf")}
    tasks = [asyncio.create_task(session(url, share[i], plays, clock, out, opened)) for i in range(sessions)]
    await opened.wait()  # every session connected: the clock starts
    start = time.perf_counter()
    clock["deadline"] = start + time_limit
    await asyncio.gather(*tasks)
    out["wall"] = time.perf_counter() - start
    stop.set()
    for result in await asyncio.gather(*slow_tasks, return_exceptions=True):
        if isinstance(result, Exception):
            out["errors"].append(f"slow-query session: {type(result).__name__}: {result}")
    return out


def counting_query(n: int) -> str:
    """A query whose work grows with n: SLOW_QUERY's string work on n rows (few SQLite steps for its time, as the
    sandbox also bounds the steps a query takes)."""
    return SLOW_QUERY.replace("FROM c)", f"FROM c WHERE x < {n})", 1)


async def one_query_each(url: str, case_id: str, sessions: int, query: str) -> list[tuple[float, bool]]:
    """`sessions` sessions of one client (this process, one address) each send `query` at once: per query, the
    seconds from the common start to its answer and whether it came back `interrupted`."""
    action = {"tool": "run_sql", "args": {"query": query}}
    clients = [GateEnvClient(base_url=url, message_timeout_s=120) for _ in range(sessions)]
    for env in clients:
        await env.connect()
        await env.reset(case_id=case_id)
    start = time.perf_counter()

    async def ask(env: GateEnvClient) -> tuple[float, bool]:
        result = await env.step(action)
        return time.perf_counter() - start, json.loads(result.observation.result) == {"error": "interrupted"}

    try:
        return await asyncio.gather(*(ask(env) for env in clients))
    finally:
        for env in clients:
            await env.close()


def burst(cases_file: str, case_id: str, sessions: int, seconds: float) -> tuple[float, list[tuple[float, bool]]]:
    """The one-client burst: on a fresh server, a counting query sized to take about `seconds` alone (measured on
    that server), then `sessions` of them from one client at once. Returns (its time alone, each query's)."""
    server = Server(cases_file, sessions)
    try:
        n, alone = 1_000, 0.0
        for _ in range(6):  # size the query by timing it alone: its work is linear in n
            took, interrupted = asyncio.run(one_query_each(server.url, case_id, 1, counting_query(n)))[0]
            if interrupted:
                n //= 4
                continue
            alone = took
            if abs(took - seconds) < 0.2 * seconds:
                break
            n = max(1, int(n * seconds / took))
        return alone, asyncio.run(one_query_each(server.url, case_id, sessions, counting_query(n)))
    finally:
        server.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def run_one(cases_file: str, sessions: int, episodes: int, plays: dict, time_limit: float, slow: int) -> dict:
    server = Server(cases_file, sessions + slow)
    try:
        asyncio.run(warm(server.url, list(plays)))
        before = proc_status(server.proc.pid)["VmRSS"]
        cpu0 = cpu_seconds(server.proc.pid)
        with Peak(server.proc.pid) as peak:
            client0 = time.process_time()
            out = asyncio.run(load(server.url, sessions, episodes, plays, time_limit, slow))
            out["client_cpu"] = time.process_time() - client0
        out["server_cpu"] = cpu_seconds(server.proc.pid) - cpu0
        out["rss_before"], out["rss_peak"] = before, peak.kib
    finally:
        code = server.stop()
    log = "".join(server.err)
    if code != 0 or "Traceback" in log:
        out["errors"].append(f"server exit {code}: {log[-1000:]}")
    return out


def row(label: str, n: int, out: dict, cores: int, adapter: float, slow: int = 0) -> int:
    """Print one row of the table; the number of problems it had."""
    steps = len(out["step"])
    rate = steps / out["wall"]
    errors = len(out["errors"]) + len(out["mismatches"])
    per_session = (out["rss_peak"] - out["rss_before"]) / (n + slow)
    print(f"{label:>8} {out['episodes']:>8} {steps:>6} {rate:>7.0f} {rate / cores:>7.0f} "
          f"{1000 * statistics.median(out['step']):>7.1f} {1000 * percentile(out['step'], 0.99):>7.1f} "
          f"{errors:>6} {per_session:>11.0f} {1000 * out['server_cpu'] / steps:>18.3f} "
          f"{adapter / (out['server_cpu'] / steps):>10.2f}")
    for line in (out["errors"] + [f"grade differs from in process: {c}" for c in out["mismatches"]])[:5]:
        print(f"    {line}")
    if out["skipped"]:
        print(f"    {out['skipped']} episodes not started: the time limit passed")
    return errors + out["skipped"]


HEADER = (f"{'sessions':>8} {'episodes':>8} {'steps':>6} {'steps/s':>7} {'per CPU':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'errors':>6} {'KiB/session':>11} {'server CPU ms/step':>18} {'gate share':>10}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="64,256,512", help="comma-separated session counts (default: 64,256,512)")
    ap.add_argument("--episodes", type=int, default=1024, help="episodes per run, shared by the sessions (default: 1024)")
    ap.add_argument("--cases", default=str(ROOT / "cases/classic/train_procedural.jsonl"))
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds after which no episode starts (default: 120)")
    ap.add_argument("--noisy", type=int, default=8, metavar="K",
                    help="the noisy-neighbours row: K sessions each running a query until the sandbox's 2 s budget "
                         "stops it, over and over, while --noisy-sessions others play (default: 8; 0: no such row)")
    ap.add_argument("--noisy-sessions", type=int, default=64, metavar="N", help="the sessions playing in that row "
                                                                               "(default: 64)")
    ap.add_argument("--noisy-rounds", type=int, default=2, metavar="R",
                    help="quiet and noisy runs, one after the other, R times (default: 2)")
    ap.add_argument("--burst", type=int, default=16, metavar="K",
                    help="one client's burst: K sessions of one client each send a query of about a second at once "
                         "(default: 16; 0: none)")
    a = ap.parse_args()
    counts = [int(x) for x in a.sessions.split(",") if x.strip()]
    load1, load5, _ = os.getloadavg()  # before this benchmark's own work
    cases = read_cases(a.cases)
    plays = record(cases)
    adapter, engine = in_process(cases, plays)
    cores = len(os.sched_getaffinity(0))
    print(f"gate serve load test: careful-sql's episodes on {len(cases)} cases ({Path(a.cases).name}), "
          f"{a.episodes} episodes per run, terminal reward; server and clients on this machine's {cores} CPUs")
    print(f"(load average before the benchmark: {load1:.2f} over 1 min, {load5:.2f} over 5)", file=sys.stderr)
    print(HEADER)
    bad = 0
    for n in counts:
        bad += row(str(n), n, run_one(a.cases, n, a.episodes, plays, a.time_limit, 0), cores, adapter)
    print(f"steps/s and latency: careful-sql's steps only; per CPU = steps/s / {cores} (the clients run on them too)")
    print(f"in process, CPU per step: GateServerEnv.step {1000 * adapter:.3f} ms, of which the engine's Session.step "
          f"{1000 * engine:.3f} ms (careful-sql's calls on every case, least of 3 rounds); gate share = "
          f"GateServerEnv.step's CPU / the server's CPU per step (the rest: uvicorn, WebSocket, openenv-core, JSON)")
    if a.noisy:
        n, k = a.noisy_sessions, a.noisy
        print(f"noisy neighbours: {n} sessions play careful-sql's episodes while {k} more each run a query until the "
              f"sandbox's 2 s budget stops it, one after another; each noisy run right after a quiet one, "
              f"{a.noisy_rounds} rounds")
        print(HEADER)
        pooled: dict[str, list] = {"quiet": [], "noisy": []}
        for _ in range(a.noisy_rounds):
            calm = run_one(a.cases, n, a.episodes, plays, a.time_limit, 0)
            bad += row("quiet", n, calm, cores, adapter)
            noisy = run_one(a.cases, n, a.episodes, plays, a.time_limit, k)
            bad += row("noisy", n, noisy, cores, adapter, k)
            slow = noisy["slow"]
            print(f"    the {k} noisy sessions: {len(slow)} queries, each {min(slow):.2f} to {max(slow):.2f} s "
                  f"(median {statistics.median(slow):.2f} s), {noisy['slow_interrupted']} of them stopped by the "
                  f"budget; p99 noisy / quiet {percentile(noisy['step'], 0.99) / percentile(calm['step'], 0.99):.2f}x")
            pooled["quiet"] += calm["step"]
            pooled["noisy"] += noisy["step"]
        q99, n99 = percentile(pooled["quiet"], 0.99), percentile(pooled["noisy"], 0.99)
        print(f"p99 step latency of the {n} playing sessions over the {a.noisy_rounds} rounds, noisy / quiet: "
              f"{1000 * n99:.1f} / {1000 * q99:.1f} ms = {n99 / q99:.2f}x (goal: at most 2x)")
    if a.burst:
        alone, answers = burst(a.cases, cases[0].case_id, a.burst, 1.0)
        cut = sum(interrupted for _, interrupted in answers)
        print(f"one client's burst: {a.burst} sessions of one client each send one query of {alone:.2f} s alone, all "
              f"at once: {len(answers) - cut} answered, {cut} came back interrupted; the last answer after "
              f"{max(t for t, _ in answers):.1f} s (a query waits at most its budget and 30 s)")
        bad += cut
    print("every episode's grade equal to the in-process grade" if bad == 0 else f"{bad} problems")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
