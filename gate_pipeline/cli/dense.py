"""`gate report --reward dense|potential`: the shaped return of policies on a case file, step and terminal apart.

Why a module of its own: it calibrates the F003 dense reward (`rewards.py`) the way the design
asked: a seeded random-tool policy should collect little, careful inspection much more, and a
correct report the rubric on top. Every episode is played by the engine in the chosen mode.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..kernel.records import EpisodeResult
from .common import play_with_progress

DENSE_AGENTS = ("random", "naive", "careful-sql", "careful")
PARTS = ("step", "terminal", "return")


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values),
            "min": min(values), "max": max(values)}


def parts(result: EpisodeResult) -> dict:
    """An episode's return split into the step part (Layers 1-2) and the terminal part (the rubric)."""
    total = result.total_reward
    return {"step": total - result.grade.reward, "terminal": result.grade.reward, "return": total}


def _table(summary: dict, where: str, n: int, seed: int, mode: str) -> str:
    lines = [f"{mode} return on {where} ({n} cases; random policy seed {seed})",
             f"{'policy':<12} {'part':<9} {'mean':>8} {'std':>8} {'min':>8} {'max':>8}"]
    for name, figures in summary.items():
        for k, part in enumerate(PARTS):
            s = figures[part]
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


def dense_report(args, cases: list, specs: list, path: Path) -> int:
    results = play_with_progress(cases, specs, reward=args.reward, workers=args.workers, show=not args.json)
    summary = {}
    for name, rs in results.items():
        split = [parts(r) for r in rs]
        summary[name] = {**{p: spread([s[p] for s in split]) for p in PARTS},
                         "mean_turns": statistics.fmean(len(r.rewards) for r in rs),
                         "agent_errors": sum(1 for r in rs if r.error)}
    if args.json:
        print(json.dumps({"cases": len(cases), "seed": args.seed, "reward": args.reward, "policies": summary}))
    else:
        print(_table(summary, Path(path).name, len(cases), args.seed, args.reward))
    return 0
