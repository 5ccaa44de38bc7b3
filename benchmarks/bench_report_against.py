"""`gate report --workers 1` of careful-sql over the 320 train cases on this checkout next to another one, taken in
turns so a slow minute slows both: ms an episode as the throughput harness takes it, (T(320) - T(1)) / 319, each
T a fresh `python -m gate_pipeline.cli.main report ... --json` process with the checkout first on PYTHONPATH.

    .venv/bin/python benchmarks/bench_report_against.py DIR [--rounds 9] [--cases FILE] [--workers N]

Prints each side's median (and its rounds) and the ratio DIR / this checkout (above 1: this checkout is faster).
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
TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"  # the 320 train cases


def seconds(checkout: Path, cases: Path, workers: int) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gate_pipeline.cli.main", "report", "--cases", str(cases), "--agents",
                    "careful-sql", "--json", "--workers", str(workers)], cwd=checkout, check=True,
                   env={**os.environ, "PYTHONPATH": str(checkout)}, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("against", type=Path)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--cases", type=Path, default=TRAIN)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    lines = a.cases.read_text().splitlines()
    one = Path(tempfile.mkdtemp()) / "one.jsonl"
    one.write_text(lines[0] + "\n")
    sides = {"this checkout": ROOT, "against": a.against.resolve()}
    for checkout in sides.values():  # the file cache and each side's bytecode warm
        seconds(checkout, one, a.workers)
    ms: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(a.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            full, single = seconds(sides[name], a.cases, a.workers), seconds(sides[name], one, a.workers)
            ms[name].append((full - single) / (len(lines) - 1) * 1e3)
    for name, values in ms.items():
        print(f"{name:14} {statistics.median(values):.3f} ms an episode (rounds: "
              f"{', '.join(f'{v:.3f}' for v in values)})")
    print(f"against / this checkout: {statistics.median(ms['against']) / statistics.median(ms['this checkout']):.3f}")


if __name__ == "__main__":
    main()
