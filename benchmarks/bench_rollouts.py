"""gate run's rollouts/s next to a bare loop of the same requests: the environment's share of a model run.

The scripted chat-completions server (tests/scripted_server.py, careful policy, 4 requests per
two-batch case) runs in its own process, as a model server would. Per round, side by side:

- gate: `run_rollouts` (what `gate run` calls) at concurrency C: the stock `openai.AsyncOpenAI`
  client, the engine playing every tool call, the run store keeping every episode, a transcript
  line per rollout, grades from the store;
- bare: the same conversations (the requests gate sent, read back from its transcripts) sent
  with the same stock client at the same concurrency, each reply read as JSON, and nothing else:
  no environment, no store, no transcript.

ratio = gate rollouts/s / bare rollouts/s: the share of a rollout's time that is not the
environment. Rounds alternate gate and bare, so a slow minute on this shared machine slows both.
Both sides are CPU-bound in this process (the server has the other core), so each round also
prints the ratio of rollouts per second of this process's CPU time, which a busy neighbour
moves less than wall time. Each side's time and CPU time are taken around its whole event loop: gate's
whole `run_rollouts` call (its run store opened before), the bare loop's client, requests and replies
(the requests read from the transcripts before), under the same collector thresholds.

    .venv/bin/python benchmarks/bench_rollouts.py [--rollouts R] [--concurrency C] [--rounds N]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from gate_pipeline.kernel.cases import Case, read_cases  # noqa: E402
from gate_pipeline.kernel.engine import fewer_collections  # noqa: E402
from gate_pipeline.kernel.settings import Settings  # noqa: E402
from gate_pipeline.kernel.suite import suites  # noqa: E402
from gate_pipeline.model_agent.agent import ModelSettings, make_client  # noqa: E402
from gate_pipeline.model_agent.rollouts import TRANSCRIPTS, read_transcripts, run_rollouts  # noqa: E402
from gate_pipeline.model_agent.tool_schemas import tool_schemas  # noqa: E402
from gate_pipeline.store import RunStore  # noqa: E402

TOOLS = tool_schemas(suites.get("classic"))  # the tools a model is offered on the classic eval cases


def conversations(run_dir: Path) -> list[list[list[dict]]]:
    """Per rollout, the message list of each request it sent (every prefix ending before a reply)."""
    out = []
    for line in read_transcripts(run_dir / TRANSCRIPTS):
        messages = line["messages"]
        out.append([messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant"])
    return out


async def _bare(settings: ModelSettings, rollouts: list[list[list[dict]]], concurrency: int) -> None:
    """Send every rollout's requests in order, `concurrency` rollouts at a time, with a client made for them."""
    client = make_client(settings)
    queue: asyncio.Queue = asyncio.Queue()
    for requests in rollouts:
        queue.put_nowait(requests)

    async def worker():
        while not queue.empty():
            for messages in queue.get_nowait():
                raw = await client.chat.completions.with_raw_response.create(
                    model=settings.model, messages=messages, tools=TOOLS, temperature=settings.temperature)
                json.loads(raw.content)

    try:
        with fewer_collections():  # the collector as gate's run has it while it plays
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()


def bare(settings: ModelSettings, rollouts: list[list[list[dict]]], concurrency: int) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) of the bare loop, its event loop and client included, as gate's are."""
    c0, t0 = cpu(), time.perf_counter()
    asyncio.run(_bare(settings, rollouts, concurrency))
    return time.perf_counter() - t0, cpu() - c0


def gate(settings: ModelSettings, cases: list[Case], rollouts: int, concurrency: int, home: Path,
         run_dir: Path) -> tuple[float, float]:
    """(seconds, CPU seconds of this process) of the whole `run_rollouts` call. The run store is opened before
    either is taken: it stands for a store that exists before the run, as a user's does (made here, in a new
    home each round, which costs more than opening one)."""
    store = RunStore(Settings(home=home))
    try:
        c0, t0 = cpu(), time.perf_counter()
        out = asyncio.run(run_rollouts(cases, settings, rollouts, concurrency, run_dir, store))
        seconds, used = time.perf_counter() - t0, cpu() - c0
    finally:
        store.dispose()
    assert len(out["records"]) == len(cases) * rollouts and all(r["reward"] == 1.0 for r in out["records"])
    return seconds, used


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per eval case (32 cases)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    cases = read_cases(ROOT / "cases" / "classic" / "eval_curated.jsonl")
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripted_server.py"), "--asyncio"],
                              stdout=subprocess.PIPE, text=True)
    try:
        settings = ModelSettings(model="scripted", base_url=server.stdout.readline().strip())
        n = len(cases) * a.rollouts
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            gate(settings, cases, 1, 8, tmp / "warm-home", tmp / "warm-up")  # imports, the server's reply cache
            print(f"{len(cases)} cases x {a.rollouts} rollouts = {n} per run, concurrency {a.concurrency}")
            print(f"{'round':>5}{'gate rollouts/s':>17}{'bare rollouts/s':>17}{'ratio':>8}"
                  f"{'gate CPU ms':>13}{'bare CPU ms':>13}{'CPU ratio':>11}")
            ratios, cpu_ratios = [], []
            for r in range(a.rounds):
                run_dir = tmp / f"run-{r}"
                seconds, gate_cpu = gate(settings, cases, a.rollouts, a.concurrency, tmp / f"home-{r}", run_dir)
                g = n / seconds
                bare_s, bare_cpu = bare(settings, conversations(run_dir), a.concurrency)
                b = n / bare_s
                ratios.append(g / b)
                cpu_ratios.append(bare_cpu / gate_cpu)
                print(f"{r + 1:>5}{g:>17.1f}{b:>17.1f}{g / b:>8.2f}{gate_cpu / n * 1e3:>13.2f}"
                      f"{bare_cpu / n * 1e3:>13.2f}{cpu_ratios[-1]:>11.2f}", flush=True)
            print(f"median ratio {statistics.median(ratios):.2f}, median CPU ratio {statistics.median(cpu_ratios):.2f} "
                  f"(goal >= 0.85: the environment's share under 15 %)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
