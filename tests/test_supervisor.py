"""gate ui's supervisor on real processes (small Python programs, no Dagster): what dies is started
again with one line, a bounded number of times, then it gives up naming the service and its last
error; Dagster's log records below the level are not passed on; a stop ends whole process groups."""
from __future__ import annotations

import io
import os
import signal
import sys
import time

import pytest

from gate_pipeline.cli.supervisor import GaveUp, Service, Supervisor, how_it_ended

PY = sys.executable


def program(code: str) -> list[str]:
    return [PY, "-c", code]


def run_until(supervisor: Supervisor, predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        supervisor.check()
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def test_a_service_that_keeps_failing_is_restarted_then_given_up_on_with_its_last_error():
    out = io.StringIO()
    failing = Service("the test service", program(
        "import sys; print('starting'); print('OSError: [Errno 98] address already in use', flush=True); sys.exit(3)"))
    sup = Supervisor([failing], restarts=2, out=out, delay=0.01)
    sup.start(failing)
    with pytest.raises(GaveUp) as caught:
        run_until(sup, lambda: False)
    lines = out.getvalue().splitlines()
    restarts = [line for line in lines if line.startswith("gate ui: the test service stopped")]
    assert len(restarts) == 2 and lines.count("starting") == 3  # first start, two restarts
    assert "(exit status 3 after 0 s; its last error: OSError: [Errno 98] address already in use)" in restarts[0]
    assert restarts[0].endswith("(restart 1 of at most 2 an hour)") and restarts[1].endswith("(restart 2 of at most 2 an hour)")
    assert str(caught.value) == ("the test service stopped (exit status 3 after 0 s; its last error: OSError: [Errno 98] "
                                 "address already in use), and it was already restarted 2 times within the hour "
                                 "(at most 2): gate ui gives up and stops Dagster")


def test_a_killed_service_is_restarted_and_restarts_age_out_of_the_window():
    out = io.StringIO()
    sleeper = Service("the sleeper", program("import time; print('up', flush=True); time.sleep(60)"))
    sup = Supervisor([sleeper], restarts=1, out=out, delay=0.01, window=0.5)
    sup.start(sleeper)
    try:
        for round_ in range(3):  # one restart an "hour" (0.5 s here): three kills, spaced out, are all restarted
            run_until(sup, lambda n=round_ + 1: out.getvalue().count("up") == n)
            first = sleeper.proc.pid
            os.killpg(first, signal.SIGKILL)
            run_until(sup, lambda old=first: sleeper.proc.pid != old and sup.alive(sleeper))
            time.sleep(0.6)
        said = [line for line in out.getvalue().splitlines() if line.startswith("gate ui:")]
        assert len(said) == 3 and all("(killed by SIGKILL after " in line and "its last error" not in line
                                      for line in said)
    finally:
        assert sup.stop([sleeper], grace=5)
    assert how_it_ended(sleeper.proc.returncode) == "killed by SIGTERM"


def test_no_restarts_gives_up_at_once():
    sup = Supervisor([s := Service("the one", program("raise SystemExit(1)"))], restarts=0, delay=0.01)
    sup.start(s)
    with pytest.raises(GaveUp, match=r"^the one stopped \(exit status 1 after 0 s\), and restarts are off "
                                     r"\(--restarts 0\): gate ui gives up"):
        run_until(sup, lambda: False)


RECORDS = r"""
print('2026-01-01 02:00:00 +0000 - dagster - DEBUG - nightly - 1234 - ASSET_OBSERVATION - an event')
print('2026-01-01 02:00:00 +0000 - dagster - DEBUG - nightly - a debug message')
print('  its second line')
print('\x1b[32m2026-01-01 02:00:01 +0000\x1b[0m - dagster.daemon - \x1b[34mINFO\x1b[0m - Launched 1 runs.')
print('2026-01-01 02:00:02 +0000 - dagster - ERROR - nightly - RUN_FAILURE - it failed')
print('Stack Trace:')
print('not a log record at all', flush=True)
"""


def test_records_below_the_level_are_held_back_and_colours_are_not_written_to_a_file():
    out = io.StringIO()
    talker = Service("the talker", program(RECORDS))
    sup = Supervisor([talker], out=out, level="info")
    sup.start(talker)
    talker.proc.wait(timeout=20)
    sup.stop([talker])
    assert out.getvalue().splitlines() == [
        "2026-01-01 02:00:01 +0000 - dagster.daemon - INFO - Launched 1 runs.",
        "2026-01-01 02:00:02 +0000 - dagster - ERROR - nightly - RUN_FAILURE - it failed",
        "Stack Trace:", "not a log record at all"]
    assert talker.last_error() == "nightly - RUN_FAILURE - it failed"  # for the message if it dies


def test_while_stopping_only_the_first_line_of_each_record_is_passed_on():
    out = io.StringIO()
    dying = Service("the dying", program(
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    print('2026-01-01 02:00:02 +0000 - dagster - ERROR - nightly - RUN_FAILURE - interrupted')\n"
        "    print('Traceback (most recent call last):'); print('KeyboardInterrupt', flush=True); sys.exit(1)\n"
        "signal.signal(signal.SIGTERM, bye); print('ready', flush=True); time.sleep(60)"))
    sup = Supervisor([dying], out=out)
    sup.start(dying)
    run_until(sup, lambda: "ready" in out.getvalue())
    assert sup.stop([dying], grace=10)
    assert out.getvalue().splitlines() == [
        "ready", "2026-01-01 02:00:02 +0000 - dagster - ERROR - nightly - RUN_FAILURE - interrupted"]


def test_stop_ends_the_whole_process_group():
    parent = Service("the parent", program(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, time; print(\"child\", os.getpid(), flush=True); "
        "time.sleep(60)'])\n"
        "time.sleep(60)"))
    out = io.StringIO()
    sup = Supervisor([parent], out=out)
    sup.start(parent)
    run_until(sup, lambda: "child" in out.getvalue())
    child = int(out.getvalue().split()[1])
    assert sup.stop([parent], grace=10)  # SIGTERM to the group: the child too, which its parent never signals
    with pytest.raises(ProcessLookupError):
        os.killpg(parent.proc.pid, 0)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
