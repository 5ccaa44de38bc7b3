"""The layering the design card asks for: the core never imports Dagster; Dagster sits on top."""
from __future__ import annotations

import subprocess
import sys

CORE = ["contract", "rules", "schemas", "cases", "generator", "world", "sandbox", "ledger", "tools", "grader",
        "runner", "tables", "rewards", "gold", "episode_api", "variants", "experiments", "html_report", "store",
        "agents", "model_agent.rollouts", "cli.main"]


def test_the_core_imports_no_dagster():
    code = ("import sys\n" + "".join(f"import gate_pipeline.{m}\n" for m in CORE)
            + "bad = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))\n"
              "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_cli_starts_without_pandas_or_pandera():
    code = ("import sys, gate_pipeline.cli.main\n"
            "gate_pipeline.cli.main.build_parser()  # imports every subcommand module\n"
            "print(sorted(m for m in ('pandas', 'pandera', 'dagster') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-1000:]
