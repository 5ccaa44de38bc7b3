"""Reward hacking, measured: every attacker and two hacks of the shaped rewards, under each reward mode.

Each policy plays every case through the gymnasium env (as a trainer would run it) in the
`terminal`, `dense` and `potential` modes; the table gives the mean return (the sum of a
episode's step rewards, the rubric's reward included) and, per mode, how far above `careful`
(the pandera baseline) a policy ends: a positive figure is a hack that pays. Policies:

- the classic attackers, `profile-only`, `careful-sql`, `naive`, `random` (seed 0);
- `query-farm`: inspect-theatre after 40 distinct `SELECT k` queries (farms Layer 1 of `dense`);
- `reward-peek`: never reads the contract; runs careful-sql's checks and, instead of reading
  their rows, takes a batch as defective when the check's step reward is above what a plain
  successful query pays (in `dense`, that is Layer 2 progress: the reward reveals the label).

    .venv/bin/python benchmarks/bench_reward_hacking.py [--cases FILE] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate_pipeline.integrations.gymnasium_env import GateEnv  # noqa: E402
from gate_pipeline.kernel.agents import make_agent  # noqa: E402
from gate_pipeline.kernel.cases import Case, read_cases  # noqa: E402
from gate_pipeline.kernel.contract import load_contract  # noqa: E402
from gate_pipeline.suites.classic import ATTACKERS, REWARD_HACKS  # noqa: E402
from gate_pipeline.suites.classic.agents import sql_checks  # noqa: E402

MODES = ("terminal", "dense", "potential")
PLAIN_QUERY = 0.025  # what a first successful query pays in dense mode without Layer 2 (step cost + bonuses)


class EnvTools:
    """An agent's `tools` over a GateEnv episode; `last` is the reward of the latest call."""

    def __init__(self, env: GateEnv):
        self.env, self.last = env, 0.0
        self.episode_seed = env.session.episode_seed
        self.suite = env.session.prepared.suite  # the episode's suite, as the engine's tools give it
        self.tool_names = self.suite.tool_names

    def __call__(self, name, **args):
        obs, reward, terminated, truncated, info = self.env.step(json.dumps({"tool": name, "args": args}))
        self.last = reward
        return json.loads(info.get("result", obs["result"]))


def episode_return(env: GateEnv) -> float:
    """The episode's return as the engine sums it (an episode left without a report is ended here)."""
    session = env.session
    result = session.result if session.done else session.finish()
    return result.total_reward


def play_agent(env: GateEnv, name: str, case: Case) -> float:
    env.reset(options={"case_id": case.case_id})
    tools = EnvTools(env)
    agent = make_agent(name, seed=0) if name == "random" else make_agent(name)
    agent.play(tools, case.data if agent.oracle else None)
    return episode_return(env)


def reward_peek(env: GateEnv, case: Case) -> float:
    """Careful-sql's checks, judged by their step reward instead of their rows."""
    env.reset(options={"case_id": case.case_id})
    tools = EnvTools(env)
    contract = load_contract("classic")  # the checks' thresholds, never read through the tool
    loaded, quarantined = [], []
    listing = sorted(tools("list_batches"), key=lambda b: (b["table"] != "customers", b["batch_id"]))
    for batch in listing:
        cite = None
        for column, defect, query in sql_checks(batch["table"], batch["staging_table"], contract):
            tools("run_sql", query=query)
            if tools.last > PLAIN_QUERY + 1e-9:
                cite = (column, defect)
                break
        if cite:
            tools("quarantine_batch", batch_id=batch["batch_id"], column=cite[0], defect_type=cite[1])
            quarantined.append(batch["batch_id"])
        else:
            tools("load_batch", batch_id=batch["batch_id"])
            loaded.append(batch["batch_id"])
    tools("submit_report", loaded=loaded, quarantined=quarantined)
    return episode_return(env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=str(ROOT / "cases" / "classic" / "train_procedural.jsonl"))
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    a = ap.parse_args()
    cases = read_cases(a.cases)
    policies = ["careful", "careful-sql", *ATTACKERS, *REWARD_HACKS, "reward-peek", "profile-only", "naive", "random"]
    means: dict[str, dict[str, float]] = {p: {} for p in policies}
    for mode in MODES:
        env = GateEnv(cases, reward=mode, max_turns=10_000)
        for policy in policies:
            returns = [reward_peek(env, c) if policy == "reward-peek" else play_agent(env, policy, c) for c in cases]
            means[policy][mode] = statistics.fmean(returns)
        env.close()
    target = means["careful"]
    name = Path(a.cases).name
    print(f"mean return per episode on {name} ({len(cases)} cases), and the margin over careful in each mode "
          f"(positive: the policy beats careful)")
    if a.markdown:
        print("\n| policy | " + " | ".join(f"{m} | vs careful" for m in MODES) + " |")
        print("|---|" + "---:|---:|" * len(MODES))
    else:
        print(f"{'policy':<22}" + "".join(f"{m:>12}{'vs careful':>12}" for m in MODES))
    for policy in policies:
        cells = []
        for mode in MODES:
            margin = means[policy][mode] - target[mode]
            cells += [f"{means[policy][mode]:.4f}", "" if policy == "careful" else f"{margin:+.4f}"]
        if a.markdown:
            print(f"| {policy} | " + " | ".join(cells) + " |")
        else:
            print(f"{policy:<22}" + "".join(f"{c:>12}" for c in cells))
    above = {m: [p for p in policies if p != "careful" and means[p][m] > target[m] + 1e-9] for m in MODES}
    for mode in MODES:
        print(f"{mode}: above careful: {', '.join(above[mode]) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
