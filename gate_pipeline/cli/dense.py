"""`gate report --reward dense`: the dense return of policies on a case file, step and terminal apart.

Why a module of its own: it calibrates the F003 dense reward (`rewards.py`) the way the design
asked: a seeded random-tool policy should collect little, careful inspection much more, and a
correct report the rubric on top. Every episode runs in `episode_api.GateEnv(reward="dense")`.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..agents import make_agent
from ..episode_api import GateEnv, run_agent
from .progress import progress_bar

DENSE_AGENTS = ("random", "naive", "careful-sql", "careful")
PARTS = ("step", "terminal", "return")


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values),
            "min": min(values), "max": max(values)}


def dense_returns(cases: list[dict], names, seed: int = 0, progress=None) -> dict:
    """{policy: {"step"|"terminal"|"return": [per case], "turns": [...], "errors": n}}."""
    env = GateEnv(cases, reward="dense")
    agents = {name: make_agent(name, seed=seed) if name == "random" else make_agent(name) for name in names}
    out = {name: {**{p: [] for p in PARTS}, "turns": [], "errors": 0} for name in names}
    for case in cases:
        for name, agent in agents.items():
            r = run_agent(env, agent, case["case_id"])
            for key in (*PARTS, "turns"):
                out[name][key].append(r[key])
            out[name]["errors"] += "error" in r
        if progress:
            progress()
    env.close()
    return out


def _table(summary: dict, where: str, n: int, seed: int) -> str:
    lines = [f"dense return on {where} ({n} cases; random policy seed {seed})",
             f"{'policy':<12} {'part':<9} {'mean':>8} {'std':>8} {'min':>8} {'max':>8}"]
    for name, parts in summary.items():
        for k, part in enumerate(PARTS):
            s = parts[part]
            lines.append(f"{name if k == 0 else '':<12} {part:<9} {s['mean']:>8.4f} {s['std']:>8.4f} "
                         f"{s['min']:>8.4f} {s['max']:>8.4f}")
    if "random" in summary:
        base = summary["random"]["return"]["mean"]
        for name in summary:
            if name != "random":
                mean = summary[name]["return"]["mean"]
                lines.append(f"{name} - random: {mean - base:+.4f} mean return"
                             + (f" ({mean / base:.1f}x)" if base > 0 else ""))
    return "\n".join(lines)


def dense_report(args, cases: list[dict]) -> int:
    names = [a.strip() for a in args.agents.split(",") if a.strip()] if args.agents else list(DENSE_AGENTS)
    with progress_bar(len(cases), "episodes") as advance:
        raw = dense_returns(cases, names, seed=args.seed, progress=advance)
    summary = {name: {**{p: spread(r[p]) for p in PARTS}, "mean_turns": statistics.fmean(r["turns"]),
                      "agent_errors": r["errors"]} for name, r in raw.items()}
    if args.json:
        print(json.dumps({"cases": len(cases), "seed": args.seed, "policies": summary}))
    else:
        print(_table(summary, Path(args.cases).name, len(cases), args.seed))
    return 0
