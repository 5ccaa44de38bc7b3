"""A machine without PostgreSQL, Redis or Chromium, simulated: a PATH with nothing on it but Python and an
empty PostgreSQL directory (GATE_TEST_POSTGRES_DIR). The README's `scripts/test-setup` says what is
missing and how to install it; `--install` says why it cannot; and the tests that start those programs
are skipped, each with one line naming the Debian package, while the rest of their files pass."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "test-setup"
PACKAGES = ("postgresql", "redis-server", "chromium", "cmake", "g++")


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> dict:
    """The environment of a machine with Python and none of the three (no apt-get either)."""
    root = tmp_path_factory.mktemp("bare")
    bin_dir, pg_dir = root / "bin", root / "postgresql"
    bin_dir.mkdir()
    pg_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATE_", "PYTEST"))}
    env.update(PATH=str(bin_dir), GATE_TEST_POSTGRES_DIR=str(pg_dir), GATE_HOME=str(root / "gate"))
    return env


def setup(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SETUP), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_test_setup_finds_what_this_machine_has():
    out = setup({**os.environ})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[1] for line in lines[:len(PACKAGES)]] == list(PACKAGES)


def test_on_a_bare_machine_test_setup_names_what_is_missing_and_how_to_install_it(bare):
    out = setup(bare)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.splitlines() == [
        "test-setup: postgresql    MISSING: skipped without it: tests/test_postgres.py, tests/test_celery.py",
        "test-setup: redis-server  MISSING: skipped without it: tests/test_celery.py",
        "test-setup: chromium      MISSING: skipped without it: tests/test_html_report.py's two browser tests",
        "test-setup: cmake         MISSING: skipped without it: tests/test_real_model.py (pip builds llama-cpp-python "
        "with it)",
        "test-setup: g++           MISSING: skipped without it: tests/test_real_model.py (pip builds llama-cpp-python "
        "with it)",
        "test-setup: 5 of 5 missing (postgresql, redis-server, chromium, cmake, g++): the tests that need them are "
        "skipped; `scripts/test-setup --install` installs them"]
    install = setup(bare, "--install")
    assert install.returncode == 1
    assert install.stderr.strip() == ("test-setup: could not install postgresql redis-server chromium cmake g++: apt-get "
                                      "is not "
                                      "here (not Debian or Ubuntu): install them with your system's package manager; "
                                      "the tests that need them will be skipped")
    assert setup(bare, "--bogus").returncode == 2


@pytest.mark.slow
def test_on_a_bare_machine_the_tests_that_need_them_skip_naming_the_package(bare):
    files = ["tests/test_postgres.py", "tests/test_celery.py", "tests/test_html_report.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *files], cwd=ROOT, env=bare,
                         capture_output=True, text=True, timeout=900, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert ("system packages: postgresql, redis-server, chromium, cmake, g++ missing; the tests that need them are "
            "skipped "
            "(`scripts/test-setup --install` installs them)") in text
    skipped = [line for line in text.splitlines() if line.startswith("SKIPPED ")]
    reasons = {re.sub(r"^SKIPPED \[\d+\] \S+: ", "", line) for line in skipped}
    install = "`scripts/test-setup --install` installs"
    assert reasons == {
        f"needs PostgreSQL (Debian package postgresql), which is not installed: {install} it",
        f"needs PostgreSQL (Debian package postgresql) and Redis (Debian package redis-server), which are not "
        f"installed: {install} them",
        f"needs Chromium (Debian package chromium), which is not installed: {install} it"}
    # the HTML report's other tests pass
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|skipped)", text))
    assert counts["passed"] >= 1 and counts["skipped"] == sum(int(n) for n in re.findall(r"SKIPPED \[(\d+)\]", text))
