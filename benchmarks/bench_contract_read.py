"""Reading the contracts and variant files gate ships, as every process that lists its agents does (Dagster's
code location as it loads): gate's reader (`kernel.contract.read_yaml`: libyaml's parser where PyYAML has it)
next to the same reader on PyYAML's parser in Python, each the best of `--rounds` passes over every file, and
whether the two read the same documents.

    .venv/bin/python benchmarks/bench_contract_read.py [--rounds N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gate_pipeline.kernel import contract  # noqa: E402


class PythonParsed(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                   contract._ContractLoader):
    """gate's contract loader on PyYAML's parser in Python."""

    def __init__(self, stream):
        yaml.SafeLoader.__init__(self, stream)


def best_pass(files: list[Path], rounds: int) -> tuple[float, list]:
    best, docs = float("inf"), []
    for _ in range(rounds):
        t = time.perf_counter()
        docs = [contract.read_yaml(f) for f in files]
        best = min(best, time.perf_counter() - t)
    return best, docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    files = sorted((ROOT / "gate_pipeline" / "data" / "contracts").rglob("*.yaml"))
    parser = contract._PARSER.__name__
    ours, docs = best_pass(files, a.rounds)
    with mock.patch.object(contract, "_PARSER", yaml.SafeLoader), \
            mock.patch.object(contract, "_ContractLoader", PythonParsed):
        theirs, python_docs = best_pass(files, a.rounds)
    print(f"{len(files)} contract and variant files, best of {a.rounds} passes:")
    print(f"  gate's reader ({parser})          {ours * 1000:7.1f} ms")
    print(f"  on PyYAML's parser in Python        {theirs * 1000:7.1f} ms   ({theirs / ours:.1f}x)")
    print(f"  the same documents: {'yes' if docs == python_docs else 'NO'}")


if __name__ == "__main__":
    main()
