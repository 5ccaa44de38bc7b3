"""Shared fixtures: the committed classic case files (tests never read ../shared)."""
from __future__ import annotations

import signal
import warnings
from pathlib import Path

import pytest

from gate_pipeline.kernel.cases import Case, read_cases
from gate_pipeline.kernel.engine import prepare
from gate_pipeline.kernel.world import PreparedCase

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"


def pytest_terminal_summary(terminalreporter):
    """One line at the end when a system package the tests start is missing (scripts/test-setup)."""
    from servers import SETUP
    missing = [p.name for p in SETUP.missing()]
    if missing:
        terminalreporter.write_line(f"system packages: {', '.join(missing)} missing; the tests that need them are "
                                    f"skipped (`{SETUP.INSTALL}` installs them)")


@pytest.fixture(scope="session")
def eval_cases() -> list[Case]:
    return read_cases(EVAL)


@pytest.fixture(scope="session")
def by_id(eval_cases) -> dict[str, Case]:
    return {c.case_id: c for c in eval_cases}


@pytest.fixture(scope="session")
def prepared(eval_cases) -> dict[str, PreparedCase]:
    return {c.case_id: prepare(c) for c in eval_cases}


@pytest.fixture(autouse=True)
def _own_gate_home(tmp_path_factory, monkeypatch):
    """Every test keeps its runs in a home of its own, its run store the SQLite one under it (a test that
    needs another home or PostgreSQL sets GATE_HOME or GATE_DB_URL itself)."""
    path = tmp_path_factory.mktemp("gate-home")
    monkeypatch.setenv("GATE_HOME", str(path))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    return path


WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signals_as_they_were(request):
    """A test that leaves a stop signal's handler changed gets it back as it was, with a warning naming the
    test. An ignored SIGINT or SIGTERM is inherited by every child a later test starts, which then never
    stops on Ctrl-C or on `terminate()` (a library's server, run in process, ignores both as it shuts down)."""
    before = {sig: signal.getsignal(sig) for sig in WATCHED_SIGNALS}
    yield
    for sig, handler in before.items():
        after = signal.getsignal(sig)
        if after is not handler and handler is not None:
            signal.signal(sig, handler)
            warnings.warn(f"{request.node.nodeid} left {signal.Signals(sig).name}'s handler at {after!r}: restored",
                          stacklevel=1)


@pytest.fixture
def home(_own_gate_home):
    """This test's GATE_HOME (a module may define a `home` of its own)."""
    return _own_gate_home


# The fast tier (`pytest -m "not slow"`) leaves out what starts servers, clusters, browsers or other
# processes, builds a wheel, or plays every agent on every surface; a test elsewhere that does the same
# carries @pytest.mark.slow itself. `pytest` with no -m runs everything.
SLOW_MODULES = frozenset({
    "test_dagster_stack", "test_dagster_webserver", "test_dagster_nightly", "test_celery", "test_postgres",
    "test_install", "test_one_engine", "test_newcomer", "test_readme", "test_openenv_server", "test_model_cli",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
