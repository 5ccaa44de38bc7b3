"""How long `gate experiment` takes: careful under every variant file over a case file.

    .venv/bin/python benchmarks/bench_experiment.py [cases/classic/eval_curated.jsonl]

Prints episodes, seconds and episodes per second (goal: the 32 eval cases x every variant
well under a minute).
"""
import sys
import time
from pathlib import Path

from gate_pipeline.experiments import run_experiment
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.variants import load_variants

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "cases/classic/eval_curated.jsonl")
    cases = read_cases(path)
    variants = load_variants()
    start = time.perf_counter()
    summary, _ = run_experiment(cases, variants)
    seconds = time.perf_counter() - start
    episodes = len(cases) * len(variants)
    print(f"{len(cases)} cases x {len(variants)} variants = {episodes} episodes in {seconds:.1f} s "
          f"({episodes / seconds:.0f} episodes/s); full-contract reward {summary['variants']['full']['reward']:.4f}")


if __name__ == "__main__":
    main()
