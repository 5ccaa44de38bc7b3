"""What the garbage collector takes of `gate report --workers 1` (careful-sql over the 320 train cases), with the
engine's young-generation threshold (`engine.GEN0_THRESHOLD`) and with Python's default of 700: the collections
of each generation and the milliseconds spent in them (timed with `gc.callbacks`), next to the command's time,
each in a fresh process, the two settings taken in turns, the median of --rounds.

    .venv/bin/python benchmarks/bench_gc.py [--rounds 5] [--cases FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"

CHILD = """
import contextlib, gc, io, json, sys, time
from gate_pipeline.cli.main import main
from gate_pipeline.kernel import engine
if sys.argv[1] == "default":
    engine.GEN0_THRESHOLD = 700
spent, count, started = [0.0], [0, 0, 0], [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        spent[0] += time.perf_counter() - started[0]
        count[info["generation"]] += 1
gc.callbacks.append(timed)
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["report", "--cases", sys.argv[2], "--agents", "careful-sql", "--json", "--workers", "1"])
assert code == 0, code
print(json.dumps({"ms": (time.perf_counter() - t) * 1e3, "gc_ms": spent[0] * 1e3, "collections": count}))
"""


def once(setting: str, cases: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, setting, str(cases)], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", type=Path, default=TRAIN)
    a = p.parse_args()
    runs: dict[str, list[dict]] = {"engine": [], "default": []}
    for _ in range(a.rounds):
        for setting in runs:
            runs[setting].append(once(setting, a.cases))
    print(f"gate report --workers 1, careful-sql over {a.cases.name}; medians of {a.rounds} fresh processes each")
    for setting, rows in runs.items():
        threshold = "700 (Python's default)" if setting == "default" else "engine.GEN0_THRESHOLD"
        gens = [statistics.median(r["collections"][g] for r in rows) for g in range(3)]
        print(f"young threshold {threshold:<24} collections (gen 0/1/2) {gens[0]:>5.0f} {gens[1]:>4.0f} {gens[2]:>3.0f}"
              f"  in the collector {statistics.median(r['gc_ms'] for r in rows):6.1f} ms"
              f"  the command {statistics.median(r['ms'] for r in rows):7.1f} ms")


if __name__ == "__main__":
    main()
