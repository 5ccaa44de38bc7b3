"""gate's openai pin is a range (`openai>=LOW,<HIGH` in pyproject.toml), tested at both ends: the venv has the newest
release the range allows (the whole suite runs on it), and here the model tests run again on the lowest, installed
by pip into a folder of its own that goes first on the path."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIN = re.search(r'"openai>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text())


def test_the_pin_is_a_range_and_the_venv_is_inside_it():
    assert PIN, "pyproject.toml pins openai as a range"
    low, high = (tuple(int(x) for x in v.split(".")) for v in PIN.groups())
    installed = tuple(int(x) for x in version("openai").split(".")[:3])
    assert low <= installed < high


@pytest.mark.slow
def test_the_model_tests_pass_on_the_lowest_openai_of_the_range(tmp_path):
    low = PIN.group(1)
    target = tmp_path / f"openai-{low}"
    # openai's own dependencies are in the venv already; `distro` is one the old releases still need
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                          f"openai=={low}", "distro"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "tests")])}
    seen = subprocess.run([sys.executable, "-c", "import openai; print(openai.__version__)"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert seen.stdout.strip() == low, seen.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow",
                          "tests/test_model_agent.py", "tests/test_model_cli.py", "tests/test_model_rollouts.py",
                          "tests/test_model_real_servers.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:]
    assert re.search(r"\d+ passed", run.stdout) and " failed" not in run.stdout
