"""Installed, not only cloned: a wheel built from the repository carries the classic cases, the
contract and its variants, and `gate report`, `attacks`, `nightly` and `experiment` run with no
arguments from a directory that is not the repository."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package built as a wheel and installed (not editable) into a folder of its own; the
    dependencies come from the test environment."""
    tmp = tmp_path_factory.mktemp("install")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp / "dist")],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp / "dist").glob("gate_pipeline-*.whl"))
    site = tmp / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    return wheel, site, tmp


def gate(installed, *args, timeout=300):
    _, site, tmp = installed
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env.update(PYTHONPATH=str(site), GATE_HOME=str(tmp / "home"))
    return subprocess.run([sys.executable, "-m", "gate_pipeline.cli.main", *args], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_wheel_ships_the_cases_and_contracts_as_files(installed):
    wheel, site, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("gate_pipeline/data/cases/classic/eval_curated.jsonl",
                 "gate_pipeline/data/cases/classic/train_procedural.jsonl",
                 "gate_pipeline/data/contracts/classic.yaml", "gate_pipeline/data/contracts/variants/full.yaml"):
        assert name in names
    shipped = site / "gate_pipeline" / "data" / "cases" / "classic" / "eval_curated.jsonl"
    assert not shipped.is_symlink() and shipped.read_bytes() == (ROOT / "cases/classic/eval_curated.jsonl").read_bytes()


def test_the_installed_package_is_the_one_that_runs(installed):
    out = gate(installed, "--help")
    assert out.returncode == 0
    _, site, tmp = installed
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import gate_pipeline; print(gate_pipeline.__file__)"],
                           cwd=tmp, env=env, capture_output=True, text=True)
    assert Path(where.stdout.strip()).is_relative_to(site)


def test_report_and_attacks_work_with_no_arguments_from_anywhere(installed):
    report = gate(installed, "report", "--json")
    assert report.returncode == 0, report.stderr
    agents = json.loads(report.stdout)["agents"]
    assert sorted(agents) == ["careful", "naive", "refuse-all"] and len(agents["careful"]) == 32
    assert all(g["reward"] == 1.0 for g in agents["careful"])
    attacks = gate(installed, "attacks")
    assert attacks.returncode == 0, attacks.stderr
    assert "careful (target)" in attacks.stdout and "citation-spray" in attacks.stdout


def test_nightly_and_experiment_work_with_no_arguments_from_anywhere(installed):
    nightly = gate(installed, "nightly")
    assert nightly.returncode == 0, nightly.stderr[-2000:]
    assert "eval split: 32 cases" in nightly.stdout and "night    1" in nightly.stdout
    experiment = gate(installed, "experiment")
    assert experiment.returncode == 0, experiment.stderr[-2000:]
    assert "careful under each contract-schema variant" in experiment.stdout and "over-strict" in experiment.stdout
