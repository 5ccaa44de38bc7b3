"""CPU instructions per careful-sql episode of `gate report`'s work, counted by valgrind (callgrind), so the
figure does not move with the machine's load: (instructions for 120 cases - for 20) / 100, each count a
new process that reads the cases from the train file's text (checked), plays them (`engine.play_cases`,
one process) and encodes the grades as `gate report --json` does. Start-up and imports cancel out.

    .venv/bin/python benchmarks/bench_instructions.py [--against DIR] [--cases FILE]

--stages also counts the work up to reading the cases and up to preparing them. --against DIR also counts the gate_pipeline package under DIR (another checkout) the same way, for a
before/after of a change. Needs valgrind on PATH.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r'''
import sys
from gate_pipeline.cli.common import grades_json, grades_of
from gate_pipeline.kernel.agents import resolve_agent
from gate_pipeline.kernel.cases import cases_of_text, read_case_text
from gate_pipeline.kernel.engine import play_cases
from gate_pipeline.kernel.engine import prepare
path, n, upto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cases = cases_of_text("\n".join(read_case_text(path).splitlines()[:n]), path)
if upto == "prepared":
    for case in cases:
        prepare(case).close()
elif upto == "graded":
    grades_json(grades_of(play_cases(cases, [resolve_agent("careful-sql")])))
'''
STAGES = {"read": "cases read and checked", "prepared": "and each prepared (its database built)",
          "graded": "and played, graded and encoded"}


def count(source: Path, cases: Path, n: int, upto: str = "graded") -> int:
    # run in the checkout: `python -c` looks in its working directory first
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(source)}
    child = [sys.executable, "-c", CHILD, str(cases.resolve()), str(n), upto]
    # once outside valgrind first: a module changed since its bytecode was written is compiled again by the first
    # run that imports it, which would count that work in whichever of the two counts came first
    subprocess.run(child, env=env, cwd=source, capture_output=True, check=False)
    p = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *child], env=env, cwd=source,
                       capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", p.stderr)
    if p.returncode or not found:
        sys.exit(f"valgrind failed: {p.stderr.strip()[-300:]}")
    return int(found.group(1))


def per_episode(source: Path, cases: Path, upto: str = "graded") -> int:
    return (count(source, cases, 120, upto) - count(source, cases, 20, upto)) // 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, help="another checkout to count the same way")
    ap.add_argument("--cases", type=Path, default=ROOT / "cases" / "classic" / "train_procedural.jsonl")
    ap.add_argument("--stages", action="store_true", help="also count up to reading and up to preparing")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH")
    if a.stages:
        for upto in ("read", "prepared"):
            print(f"{STAGES[upto]:<40} {per_episode(ROOT, a.cases, upto):>12,} instructions per case")
    mine = per_episode(ROOT, a.cases)
    print(f"this checkout: {mine:,} instructions per careful-sql episode ({a.cases.name}, 120 - 20 cases)")
    if a.against is not None:
        other = per_episode(a.against.resolve(), a.cases)
        print(f"--against {a.against}: {other:,} instructions per episode; this checkout / it: {mine / other:.3f}")


if __name__ == "__main__":
    main()
