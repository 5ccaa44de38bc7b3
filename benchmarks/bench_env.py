"""Env throughput with the dense reward on and off: steps/s and episodes/s of `GateEnv`.

Why: F003's dense reward must cost at most 15% more than the terminal rubric alone. The same
recorded actions (careful-sql's and the seeded random policy's, on every case of the file) are
replayed through the gymnasium env's `reset/step` in both modes. Other work on a shared machine only ever
adds time, so each episode is timed `--rounds` times per mode (modes alternating) and a mode's
time is the sum over episodes of the episode's fastest run. Cases are prepared (and gold rows computed)
before timing, as a training run reuses them; the one-off cost per case is printed apart.

    .venv/bin/python benchmarks/bench_env.py [--cases FILE] [--rounds N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_pipeline.integrations.gymnasium_env import GateEnv  # noqa: E402
from gate_pipeline.kernel.cases import Case, read_cases  # noqa: E402
from gate_pipeline.kernel.engine import play, prepare  # noqa: E402
from gate_pipeline.suites.classic.gold import gold_rows  # noqa: E402


class Recorder:
    """Wraps an agent: plays it through the engine and keeps the actions it sent."""

    def __init__(self, name: str, actions: list):
        from gate_pipeline.kernel.agents import make_agent
        self.agent, self.actions = make_agent(name), actions
        self.oracle = False

    def play(self, tools, case=None):
        outer = self

        class Recording:
            episode_seed = tools.episode_seed
            suite, tool_names = tools.suite, tools.tool_names

            def __call__(self, name, **args):
                outer.actions.append({"tool": name, "args": args})
                return tools(name, **args)
        self.agent.play(Recording(), case)


def record(cases: list[Case]) -> list[tuple[str, list[dict]]]:
    """(case id, actions) for careful-sql and the random policy (seed 0) on every case."""
    from gate_pipeline.kernel.agents import AgentSpec
    out = []
    for name in ("careful-sql", "random"):
        for case in cases:
            actions: list[dict] = []
            play(prepare(case), AgentSpec(name, {}, lambda name=name, actions=actions: Recorder(name, actions), name))
            out.append((case.case_id, actions))
    return out


def one_round(env: GateEnv, episodes) -> float:
    start = time.perf_counter()
    for case_id, actions in episodes:
        env.reset(options={"case_id": case_id})
        for action in actions:
            env.step(action)
    return time.perf_counter() - start


def fastest(envs: dict, episodes, rounds: int) -> dict:
    """{mode: sum over episodes of the episode's fastest time}."""
    total = dict.fromkeys(envs, 0.0)
    for episode in episodes:
        chunk = [episode]
        best = dict.fromkeys(envs, float("inf"))
        for k in range(rounds):
            for mode in (list(envs) if k % 2 == 0 else list(envs)[::-1]):
                best[mode] = min(best[mode], one_round(envs[mode], chunk))
        for mode in envs:
            total[mode] += best[mode]
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="cases/classic/train_procedural.jsonl")
    ap.add_argument("--rounds", type=int, default=25)
    a = ap.parse_args()
    cases = read_cases(a.cases)
    episodes = record(cases)
    envs = {mode: GateEnv(cases, reward=mode) for mode in ("terminal", "dense")}
    t0 = time.perf_counter()
    for case in cases:
        prepare(case)
    prep = (time.perf_counter() - t0) / len(cases)
    t0 = time.perf_counter()
    for case in cases:
        gold_rows(case)
    gold = (time.perf_counter() - t0) / len(cases)
    for env in envs.values():  # warm: prepared images and gold rows cached, as in training
        one_round(env, episodes)
    best = fastest(envs, episodes, a.rounds)
    steps = sum(len(actions) for _, actions in episodes)
    print(f"{len(episodes)} episodes ({len(cases)} cases x careful-sql, random), {steps} steps; "
          f"each episode's fastest of {a.rounds} runs per mode")
    print(f"{'reward':<9} {'steps/s':>10} {'episodes/s':>11} {'ms/episode':>11}")
    for mode, seconds in best.items():
        print(f"{mode:<9} {steps / seconds:>10.0f} {len(episodes) / seconds:>11.1f} "
              f"{1000 * seconds / len(episodes):>11.3f}")
    extra = best["dense"] / best["terminal"] - 1
    print(f"dense costs {100 * extra:+.1f}% time per episode (goal: at most +15%)")
    print(f"one-off per case, before its first episode: prepare {1000 * prep:.1f} ms, gold rows {1000 * gold:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
