"""What makes an episode cheap changes nothing an episode shows: the loader's rows made in bulk and on first
use, the catalogue the compile check reuses, cases read while the first ones play."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.kernel import compile_check
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play, prepare
from gate_pipeline.kernel.sandbox import Sandbox
from gate_pipeline.kernel.world import connect
from gate_pipeline.suites.classic.world import _wh_rows, loader_amount

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"


@pytest.mark.parametrize("amounts", [["12.50", " 7 ", "1e3"], ["12.50", "abc", None, ""], ["nan", "-inf", "1e400", "\t3\n"]])
def test_the_loader_reads_amounts_in_bulk_as_it_reads_them_one_by_one(amounts):
    rows = [{"order_id": f"O{k}", "customer_id": "C1", "amount": a, "currency": "USD", "status": "placed",
             "order_date": "2026-09-01"} for k, a in enumerate(amounts)]
    got = _wh_rows("orders", rows)
    want = [(r["order_id"], r["customer_id"], loader_amount(r["amount"]), r["currency"], r["status"], r["order_date"])
            for r in rows]
    assert repr(got) == repr(want)  # repr: NaN equals NaN
    assert _wh_rows("orders", []) == []


def test_a_batch_s_loader_rows_are_made_when_it_is_first_loaded_and_played_as_before():
    case = next(c for c in read_cases(TRAIN) if any(b.defective for b in c.batches))
    prepared = prepare(case)
    try:
        assert prepared._load_rows == {}
        assert prepared.correct_mart is not None
        clean = {b.batch_id for b in case.batches if not b.defective}
        assert set(prepared._load_rows) == clean
        result = play(prepared, "naive")  # loads every batch, the defective ones too
        assert set(prepared._load_rows) == set(prepared.order) and result.grade.revenue != result.grade.correct_revenue
    finally:
        prepared.close()


def test_the_compile_check_is_given_the_schema_again_once_gate_changes_it():
    """The sandbox reads the catalogue for the compile check once, and again after a statement of gate's own
    that may change the schema: the check then keys on the new schema (a new child compiles it)."""
    conn = connect()
    conn.execute("CREATE TABLE stg_a (x TEXT)")
    sandbox = Sandbox(conn)
    query = "SELECT x FROM stg_a WHERE x IN (SELECT x FROM stg_a)"
    sandbox.execute(query)
    assert [name for name, _ in sandbox._catalogue] == ["stg_a"]
    sandbox.execute("SELECT 1")
    conn.execute("INSERT INTO stg_a VALUES ('1')")  # no change of schema: the catalogue stands
    assert sandbox._catalogue is not None
    conn.execute("CREATE TEMP TABLE gate_held (k TEXT)")
    assert sandbox._catalogue is None
    for check in compile_check._IDLE:
        check.close()
    sandbox._compiled = None  # (the same text just after it passed is not checked again)
    sandbox.execute(query)
    assert [name for name, _ in sandbox._catalogue] == ["stg_a", "gate_held"]
    assert any(check._child is not None for check in compile_check._IDLE)  # checked on the new schema


def test_a_run_of_cases_starts_its_compile_check_child_before_the_first_statement_needs_it():
    """The child that compiles a statement with a subquery first took some 30 ms to start, and was started by
    the first such statement, which waited for it: a run of cases starts it as it begins, so it gets ready
    while the cases are read and prepared (naive sends no SQL at all: the child is there all the same)."""
    child = subprocess.run([sys.executable, "-c", f"""
import os
from gate_pipeline.kernel import compile_check
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play_cases
cases = read_cases({str(TRAIN)!r})[:2]
before = sum(c.running() for c in compile_check._IDLE)
play_cases(cases, ["naive"])
print(before, sum(c.running() and c.pid == os.getpid() for c in compile_check._IDLE))
"""], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["0", "1"]


def test_forked_workers_start_and_reap_their_own_compile_check_children(tmp_path):
    """Each forked worker starts its own compile-check child as it begins. A worker forked while another thread of
    the parent held the checks' lock waited for it for ever (and its parent for the worker); and a worker ended
    with `os._exit`, leaving its child to be reaped by whoever inherited it (a zombie for as long as that
    process ran, where gate is the container's first process). Here the parent holds the lock in another thread
    while it forks, and, as a subreaper, would inherit any child a worker leaves."""
    if not sys.platform.startswith("linux"):
        pytest.skip("a subreaper is Linux's")
    child = subprocess.run([sys.executable, "-c", f"""
import ctypes, os, threading, time
from gate_pipeline.kernel import compile_check
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play_cases
ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
cases = read_cases({str(TRAIN)!r})[:4]
held, done = threading.Event(), threading.Event()
def hold():
    with compile_check._IDLE_LOCK:
        held.set()
        done.wait(60)
threading.Thread(target=hold, daemon=True).start()
held.wait()
results = play_cases(cases, ["careful-sql"], workers=2)
done.set()
time.sleep(1.0)  # a child left by a worker notices it gone within a quarter of a second, and ends
mine = []
for pid in os.listdir("/proc"):
    try:
        fields = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        continue
    if pid.isdigit() and int(fields[1]) == os.getpid():
        mine.append(fields[0])
print(len(results["careful-sql"]), sorted(mine))
"""], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["4", "[]"]


def test_a_bad_case_late_in_the_file_is_one_line_and_exit_2_whatever_the_workers(tmp_path, capsys):
    cases = read_cases(TRAIN)[:40]
    path = tmp_path / "cases.jsonl"
    lines = [c.line().rstrip("\n") for c in cases]
    lines[35] = lines[35].replace('"batches": [', '"batches": 7, "x": [', 1)
    path.write_text("\n".join(lines) + "\n")
    for workers in ("1", "2"):
        assert main(["report", "--cases", str(path), "--agents", "careful-sql", "--json", "--workers", workers]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and f"{path}:36" in captured.err


def test_a_case_s_image_is_the_same_built_on_the_kept_connection_and_a_new_one():
    """Images are built on one kept connection per thread (`world.scratch`): the bytes are those a new
    connection builds, for every train case in turn, a build that fails leaves nothing for the next, and a
    forked process builds on a connection of its own."""
    import os

    from gate_pipeline.kernel import world
    from gate_pipeline.suites.classic import world as classic
    cases = read_cases(TRAIN)[:40]
    kept = [prepare(c).image for c in cases]
    fresh = []
    real = classic.scratch
    try:
        classic.scratch = connect  # a new connection for every build
        fresh = [prepare(c).image for c in cases]
    finally:
        classic.scratch = real
    assert kept == fresh
    broken = prepare(cases[0])
    broken.seed_rows = {"orders": [("too", "few")]}  # a build that fails midway (rows too short)
    with pytest.raises(sqlite3.Error):
        broken._build_image()
    assert not world.scratch().in_transaction and prepare(cases[1]).image == kept[1]
    parents = world.scratch()
    pid = os.fork()
    if pid == 0:  # the child's first build opens its own connection
        os._exit(0 if world.scratch() is not parents and world.scratch() is world.scratch() else 1)
    assert os.waitpid(pid, 0)[1] == 0 and world.scratch() is parents


def test_fewer_collections_puts_the_process_thresholds_back_whatever_order_overlapping_blocks_end_in():
    """Blocks that overlap in two threads (the first to start is the first to end) or nest in one: the collector's
    thresholds are raised while any is open and are the process's own once all have ended (a second block used
    to keep the raised threshold it found and put it back last)."""
    import gc
    import threading

    from gate_pipeline.kernel.engine import GEN0_THRESHOLD, fewer_collections
    before = gc.get_threshold()
    gc.set_threshold(123, *before[1:])
    try:
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        seen = []

        def first():
            with fewer_collections():
                first_in.set()
                second_in.wait(10)
            first_out.set()

        def second():
            first_in.wait(10)
            with fewer_collections():
                second_in.set()
                first_out.wait(10)
                seen.append(gc.get_threshold()[0])
                with fewer_collections():
                    seen.append(gc.get_threshold()[0])

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert seen == [GEN0_THRESHOLD, GEN0_THRESHOLD]
        assert gc.get_threshold() == (123, *before[1:])
    finally:
        gc.set_threshold(*before)


def test_a_process_forked_while_another_thread_is_in_fewer_collections_can_play():
    """A worker forked at the moment another thread holds fewer_collections' lock inherited it held: its own
    play_cases waited on it for ever, and its parent on the worker (an outside review's; 1 in ~4 batches with a
    thread looping over the block)."""
    import os
    import signal
    import threading

    from gate_pipeline.kernel import engine
    held, release = threading.Event(), threading.Event()

    def hold():
        with engine._COLLECTIONS.lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: SIGALRM's default action ends it if the block never starts
        signal.alarm(5)
        with engine.fewer_collections():
            pass
        os._exit(0)
    release.set()
    thread.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked process waited on the lock for ever"
