"""The nightly's cost next to the engine's: `gate nightly` over the 320 train cases x naive, careful,
refuse-all, next to `gate report --workers 1` playing the same 960 episodes in one process.

Both are timed as commands (a new process each, imports and start-up included), side by side in
each round, on the SQLite run store under a fresh GATE_HOME and, with --postgres, on a PostgreSQL
server started on 127.0.0.1 for the run (tests/servers.py; Debian's postgresql). The ratio is the
nightly's seconds over the report's in the same round; the figure is the median over the rounds.
Each round also checks that the nightly's mean rewards equal the report's.

    .venv/bin/python benchmarks/bench_nightly_ratio.py [--rounds 3] [--postgres] [--cases N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/servers.py: PostgreSQL
sys.path.insert(0, str(ROOT))

from gate_pipeline.kernel.cases import read_cases, write_cases  # noqa: E402
from gate_pipeline.kernel.grading import exact_mean  # noqa: E402

TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"
AGENTS = ["naive", "careful", "refuse-all"]
GOAL = 1.5
KEY = "bench-nightly-ratio-store-key-0123456789abcdef"
GATE = str(Path(sys.executable).parent / "gate")


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"{' '.join(cmd[:2])} failed: {p.stderr.strip()[-400:]}")
    return seconds, p.stdout


def rewards_of_report(text: str) -> dict[str, float]:
    grades = json.loads(text)["agents"]
    return {a: float(exact_mean(g["reward"] for g in gs)) for a, gs in grades.items()}


def backend(name: str, cases_file: Path, rounds: int, work: Path, url: str | None) -> list[float]:
    ratios = []
    for r in range(rounds):
        env = {**os.environ, "GATE_HOME": str(work / f"{name}-{r}"), "GATE_STORE_KEY": KEY}
        if url is not None:
            env["GATE_DB_URL"] = url
        report_s, out = timed([GATE, "report", "--cases", str(cases_file), "--agents", ",".join(AGENTS), "--json",
                               "--workers", "1"], env)
        nightly_s, night = timed([GATE, "nightly", "--cases", str(cases_file), "--agents", ",".join(AGENTS),
                                  "--json"], env)
        expected = rewards_of_report(out)
        got = {a: s["reward"] for a, s in json.loads(night)["agents"].items()}
        same = all(abs(got[a] - expected[a]) < 5e-5 for a in AGENTS)
        ratios.append(nightly_s / report_s)
        print(f"{name:10s} round {r + 1}: gate report {report_s:6.2f} s   gate nightly {nightly_s:6.2f} s   "
              f"ratio {nightly_s / report_s:4.2f}   same rewards: {'yes' if same else 'NO'}", flush=True)
        if not same:
            sys.exit(f"the nightly's rewards {got} differ from the report's {expected}")
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", type=int, default=0, help="the first N train cases (default: all 320)")
    ap.add_argument("--postgres", action="store_true", help="also on a PostgreSQL server on 127.0.0.1")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gate-bench-night-"))
    cases = read_cases(TRAIN)[:a.cases or None]
    cases_file = write_cases(work / "train.jsonl", cases)
    print(f"{len(cases)} train cases x {', '.join(AGENTS)} = {len(cases) * len(AGENTS)} episodes; each round: "
          f"`gate report --workers 1`, then `gate nightly` (new processes, start-up included); {os.cpu_count()} CPUs",
          flush=True)
    medians = {"sqlite": statistics.median(backend("sqlite", cases_file, a.rounds, work, None))}
    if a.postgres:
        from servers import postgres
        with postgres() as pg:
            url = pg.create_database(f"gate_{uuid.uuid4().hex[:12]}")
            medians["postgresql"] = statistics.median(backend("postgresql", cases_file, a.rounds, work, url))
    for name, ratio in medians.items():
        print(f"median nightly/report on {name}: {ratio:.2f}x (goal <= {GOAL}x): {'met' if ratio <= GOAL else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
