"""run_sql: read-only, budgeted and limited; every write attempt refused with the warehouse
unchanged; tables read recorded on every execution, from what SQLite resolves."""
from __future__ import annotations

import os
import sys
import time

import pytest

CASE = "eval-blank-amount-0"


@pytest.fixture
def ep(prepared):
    p = prepared[CASE]
    e = p.suite.episode(p)
    yield e
    e.close()


def stg(ep, k=0):
    return ep.prepared.listing[k]["staging_table"]


def state(ep):
    c = ep.world.conn
    tables = c.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    return tables, [c.execute(f"SELECT * FROM {t}").fetchall() for (t,) in tables]


WRITES = [
    ("DELETE FROM {stg} WHERE TRIM(amount) = ''", "not authorized", "DatabaseError"),
    ("UPDATE {stg} SET currency = 'USD'", "not authorized", "DatabaseError"),
    ("INSERT INTO wh_orders VALUES ('O1','C1',1.0,'USD','placed','2026-09-01')", "not authorized", "DatabaseError"),
    ("DROP TABLE wh_orders", "not authorized", "DatabaseError"),
    ("CREATE TABLE x (a)", "not authorized", "DatabaseError"),
    ("CREATE TEMP TABLE x (a)", "not authorized", "DatabaseError"),
    ("CREATE VIEW v AS SELECT 1", "not authorized", "DatabaseError"),
    ("PRAGMA query_only = OFF", "not authorized", "DatabaseError"),
    ("ATTACH DATABASE ':memory:' AS scratch", "not authorized", "DatabaseError"),
    ("BEGIN", "not authorized", "DatabaseError"),
    ("SELECT 1; DELETE FROM {stg}", "You can only execute one statement at a time.", "ProgrammingError"),
    ("SELECT zeroblob(10)", "not authorized to use function: zeroblob", "OperationalError"),
    ("SELECT randomblob(10)", "not authorized to use function: randomblob", "OperationalError"),
    ("SELECT load_extension('x')", "not authorized to use function: load_extension", "OperationalError"),
]


@pytest.mark.parametrize("query, error, note", WRITES)
def test_write_attempts_are_refused(ep, query, error, note):
    before = state(ep)
    q = query.format(stg=stg(ep))
    assert ep.call("run_sql", {"query": q}) == {"error": error}
    e = ep.ledger.entries[-1]
    assert (e["executed"], e["note"], e["args"]) == (False, note, {"query": q})
    assert state(ep) == before
    assert ep.call("run_sql", {"query": "SELECT COUNT(*) FROM wh_orders"})["rows"] == [[30]]


def test_loader_still_writes_after_refusals(ep):
    ep.call("run_sql", {"query": "DROP TABLE wh_orders"})
    bid = ep.prepared.order[0]
    assert ep.call("load_batch", {"batch_id": bid})["status"] == "loaded"


def test_runaway_recursion_hits_the_step_budget(ep):
    q = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    assert ep.call("run_sql", {"query": q}) == {"error": "interrupted"}
    assert ep.ledger.entries[-1]["note"] == "OperationalError"


def test_time_budget(ep, monkeypatch):
    # the budgets are the episode's sandbox's own (kernel.sandbox.Sandbox takes them when it is built)
    monkeypatch.setattr(ep.world.sandbox, "step_budget", 10**12)
    monkeypatch.setattr(ep.world.sandbox, "time_budget", 0.05)
    q = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    assert ep.call("run_sql", {"query": q}) == {"error": "interrupted"}


class HoldingPacer:
    """A pacer that holds a query at its first progress check for `hold` seconds, or until the deadline it is told
    (as `gate serve`'s baton may hold a query waiting for its turn), and records what it was told."""

    def __init__(self, hold: float | None = None):
        self.hold = hold
        self.deadlines: list[float] = []
        self.ended = 0

    def wait(self, deadline):
        self.deadlines.append(deadline)
        if len(self.deadlines) > 1:
            return 0.0
        start = time.monotonic()
        until = deadline if self.hold is None else min(deadline, start + self.hold)
        time.sleep(max(0.0, until - start))
        return time.monotonic() - start

    def done(self):
        self.ended += 1


LOOP = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"


def test_a_query_held_for_its_turn_keeps_its_whole_budget_and_waits_no_longer_than_max_wait(ep, monkeypatch):
    """Waiting for its turn (gate serve's baton) is not the query's time: beside other sessions' queries it ran
    out of its budget waiting and answered `interrupted` where it answers rows alone. It may wait MAX_WAIT_S
    beyond its budget, no more."""
    from gate_pipeline.kernel import sandbox
    monkeypatch.setattr(ep.world.sandbox, "step_budget", 10**12)
    monkeypatch.setattr(ep.world.sandbox, "time_budget", 0.3)
    monkeypatch.setattr(sandbox, "MAX_WAIT_S", 0.6)
    for hold, least, most in ((0.4, 0.3 + 0.4, 0.3 + 0.4 + 0.4), (None, 0.3 + 0.6, 0.3 + 0.6 + 0.4)):
        pacer = HoldingPacer(hold)
        sandbox.pace(pacer)
        try:
            start = time.monotonic()
            assert ep.call("run_sql", {"query": LOOP}) == {"error": "interrupted"}
            took = time.monotonic() - start
            assert ep.call("run_sql", {"query": "SELECT 1"})["rows"] == [[1]]  # too short for a progress check
        finally:
            sandbox.pace(None)
        assert least <= took <= most, (hold, took)  # its budget after the hold; held at most MAX_WAIT_S
        assert pacer.ended == 2  # told of both queries' ends
        assert pacer.deadlines[0] == pytest.approx(start + 0.3 + 0.6, abs=0.05)  # told how long it may wait
    assert ep.call("run_sql", {"query": LOOP}) == {"error": "interrupted"} and pacer.ended == 2  # no pacer now


def test_a_query_held_for_its_turn_answers_as_it_does_alone(ep, monkeypatch):
    """A query that finishes well within its budget alone finishes so however long it waits for its turn."""
    from gate_pipeline.kernel import sandbox
    monkeypatch.setattr(ep.world.sandbox, "time_budget", 0.3)
    query = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 50000) SELECT COUNT(*) FROM r"
    alone = ep.call("run_sql", {"query": query})
    assert alone["rows"] == [[50000]]
    sandbox.pace(HoldingPacer(1.0))  # held three times its budget at its first progress check
    try:
        assert ep.call("run_sql", {"query": query}) == alone
    finally:
        sandbox.pace(None)


class Broken(Exception):
    pass


class BrokenPacer(HoldingPacer):
    def wait(self, deadline):
        raise Broken("the pacer broke")


def test_an_exception_inside_a_callback_is_raised_again_not_answered_as_interrupted(ep):
    """SQLite swallows what a callback raises and stops the query with the words of a stop ('interrupted'):
    the sandbox gives the exception back to gate instead of telling the agent its query was interrupted."""
    from gate_pipeline.kernel import sandbox
    q = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    sandbox.pace(BrokenPacer())
    try:
        with pytest.raises(Broken, match="the pacer broke"):
            ep.call("run_sql", {"query": q})
    finally:
        sandbox.pace(None)
    assert ep.call("run_sql", {"query": "SELECT 1"})["rows"] == [[1]]  # the sandbox as before: guarded, limits back
    assert ep.call("run_sql", {"query": q}) == {"error": "interrupted"}  # its own budget's stop is still the agent's
    assert ep.call("run_sql", {"query": "DELETE FROM wh_orders"}) == {"error": "not authorized"}
    assert ep.world.conn.getlimit(sandbox.LIMITS["length"][0]) > sandbox.LIMITS["length"][1]


@pytest.mark.parametrize("at", ["call", "line"])
def test_ctrl_c_inside_a_v2_sql_function_is_gates_where_the_function_runs(at):
    """v2's date functions are Python, called for every row: Ctrl-C raised inside one's body (the wrapper's `try`)
    was answered 'user-defined function raised exception' and the run played on; it is gate's KeyboardInterrupt.
    Raised before the wrapper's first line, SQLite's words are those of arguments it could not convert, which
    an agent can make: the query's error, Ctrl-C lost."""
    import sys
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import FUNCTION_RAISED
    path = Path(__file__).resolve().parents[1] / "cases" / "v2" / "eval_curated.jsonl"
    session = Session(prepare(read_cases(path)[0]), "probe")
    sys.settrace(_interrupting(None, lambda frame: frame.f_code.co_name == "call"
                               and "sql_function" in frame.f_code.co_qualname, at))
    try:
        if at == "line":
            with pytest.raises(KeyboardInterrupt):
                session.tools("run_sql", query="SELECT date('2026-01-01')")
        else:
            assert session.tools("run_sql", query="SELECT date('2026-01-01')") == {"error": FUNCTION_RAISED}
    finally:
        sys.settrace(None)
    assert session.tools("run_sql", query="SELECT date('2026-01-01')")["rows"] == [["2026-01-01"]]
    session.finish()


def test_ctrl_c_before_a_sql_functions_first_line_in_a_load_is_gates():
    """v2's loader reads amounts through gate_amount: Ctrl-C raised before the function's first line failed the
    load with a function's words and the episode was graded as the agent's error (2 of 300 real signals in
    careful-v2's episodes). Gate's own statements never fail by a function: it is Ctrl-C."""
    import sys
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    path = Path(__file__).resolve().parents[1] / "cases" / "v2" / "eval_curated.jsonl"
    session = Session(prepare(read_cases(path)[0]), "probe")
    orders = [b["batch_id"] for b in session.tools("list_batches") if b["table"] == "orders"]
    sys.settrace(_interrupting(None, lambda frame: frame.f_code.co_name == "call"
                               and "sql_function" in frame.f_code.co_qualname, "call"))
    try:
        with pytest.raises(KeyboardInterrupt):
            session.tools("load_batch", batch_id=orders[0])
    finally:
        sys.settrace(None)
    session.abandon("interrupted")


def test_a_sql_functions_error_is_the_querys_what_else_it_raises_is_gates(prepared):
    """A function given through sql_function: its error (an Exception) is the agent's query error as ever;
    anything else it raises (what a signal raises) comes back out of the tool call."""
    from gate_pipeline.kernel import sandbox
    p = prepared[CASE]
    e = p.suite.episode(p)
    try:
        what = {"raise": ValueError("bad argument")}

        def fn(x):
            raise what["raise"]
        e.world.conn.create_function("gate_probe", 1, sandbox.sql_function(fn))
        assert e.call("run_sql", {"query": "SELECT gate_probe(1)"}) == {"error": sandbox.FUNCTION_RAISED}
        what["raise"] = SystemExit(3)  # not an Exception: not the function's own error
        with pytest.raises(SystemExit):
            e.call("run_sql", {"query": "SELECT gate_probe(1)"})
        what["raise"] = ValueError("bad argument")
        assert e.call("run_sql", {"query": "SELECT gate_probe(1)"}) == {"error": sandbox.FUNCTION_RAISED}
        assert e.call("run_sql", {"query": "SELECT 1"})["rows"] == [[1]]
        e.world.conn.create_function("gate_unwrapped", 1, fn)  # an unwrapped function's error: the query's too
        assert e.call("run_sql", {"query": "SELECT gate_unwrapped(1)"}) == {"error": sandbox.FUNCTION_RAISED}
    finally:
        e.close()


@pytest.mark.parametrize("query", ["SELECT date(CAST(x'ff' AS TEXT))", "SELECT strftime('%Y', char(55296))",
                                   "SELECT julianday(CAST(x'c0' AS TEXT))"])
def test_text_a_sql_function_cannot_be_given_is_the_agents_error_not_ctrl_c(query):
    """SQLite fails a Python function whose arguments it cannot convert (text that is not UTF-8) with the words
    of a function that raised, before the function runs: an outside review's agent made gate raise
    KeyboardInterrupt with it (a whole batch, a model run, a gym step stopped). It is the query's error."""
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import FUNCTION_RAISED
    path = Path(__file__).resolve().parents[1] / "cases" / "v2" / "eval_curated.jsonl"
    session = Session(prepare(read_cases(path)[0]), "probe")
    assert session.tools("run_sql", query=query) == {"error": FUNCTION_RAISED}
    assert session.tools("run_sql", query="SELECT 1")["rows"] == [[1]]
    session.finish()


def _interrupting(code, when, at: str):
    """A tracer that raises KeyboardInterrupt in the first frame of `code` for which `when(frame)` holds: at its
    'call' event (before its first line: where a pending signal is raised) or at its second 'line' event (inside
    the body's `try`)."""
    import sys

    def local(frame, event, arg):
        if event == "line":
            local.lines += 1
            if local.lines == 2:
                sys.settrace(None)
                frame.f_trace = None
                raise KeyboardInterrupt
        return local
    local.lines = 0

    def tracer(frame, event, arg):
        if event == "call" and (code is None or frame.f_code is code) and when(frame):
            if at == "call":
                sys.settrace(None)
                raise KeyboardInterrupt
            return local
        return None
    return tracer


@pytest.mark.parametrize("suite", ["classic", "v2"])
def test_ctrl_c_while_the_sandbox_reads_the_schema_is_an_interrupt(suite):
    """Before a statement with a subquery the sandbox reads the schema for the compile check (gate's own
    statement): Ctrl-C raised in the authorizer there was answered to the agent as 'not authorized' (an
    outside review: 17 of 300 real signals graded careful-v2 0 as an agent's error)."""
    import sqlite3
    import sys
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import Sandbox
    path = Path(__file__).resolve().parents[1] / "cases" / suite / "eval_curated.jsonl"
    session = Session(prepare(read_cases(path)[0]), "probe")
    session.episode.world.sandbox._catalogue = None  # as after a statement of gate's that may change the schema
    sys.settrace(_interrupting(Sandbox._authorize.__code__,
                               lambda frame: not frame.f_locals["self"].guard
                               and frame.f_locals.get("action") == sqlite3.SQLITE_READ
                               and frame.f_locals.get("arg1") == "sqlite_master", "call"))
    try:
        with pytest.raises(KeyboardInterrupt):
            session.tools("run_sql", query="SELECT (SELECT 1)")
    finally:
        sys.settrace(None)
    assert session.tools("run_sql", query="SELECT (SELECT 1)")["rows"] == [[1]]
    session.finish()


def test_ctrl_c_while_a_v2_episode_borrows_its_database_leaves_it_to_the_next():
    """Opening an episode on the case's prepared database begins a transaction on a connection whose callbacks
    are the last episode's: Ctrl-C there failed it with 'not authorized' and left the database marked busy,
    so every later episode of the case built a database of its own."""
    import sqlite3
    import sys
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import Sandbox
    path = Path(__file__).resolve().parents[1] / "cases" / "v2" / "eval_curated.jsonl"
    prepared = prepare(read_cases(path)[0])
    try:
        Session(prepared, "probe").finish()
        sys.settrace(_interrupting(Sandbox._authorize.__code__,
                                   lambda frame: frame.f_locals.get("action") == sqlite3.SQLITE_TRANSACTION
                                   and frame.f_locals.get("arg1") == "BEGIN", "call"))
        try:
            with pytest.raises(KeyboardInterrupt):
                Session(prepared, "probe")
        finally:
            sys.settrace(None)
        session = Session(prepared, "probe")
        assert session.episode.world._borrowed
        session.finish()
    finally:
        prepared.close()


@pytest.mark.parametrize("at", ["call", "line"])
def test_ctrl_c_during_gates_own_statement_is_an_interrupt_not_the_agents_error(prepared, at):
    """Ctrl-C raised in the authorizer while gate's loader prepares its INSERT (the callbacks run for gate's own
    statements too): before the callback's first line it failed the load with 'not authorized', which the engine
    took for the agent's error; inside it, the load was refused the same way. Now the load goes on where the
    callback kept the exception, and either way Ctrl-C comes out of the tool call."""
    import sqlite3
    import sys

    from gate_pipeline.kernel.sandbox import Sandbox
    p = prepared[CASE]
    e = p.suite.episode(p)
    try:
        bid = e.prepared.order[0]
        table = "wh_" + e.prepared.batches[bid].table
        before = e.world.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        sys.settrace(_interrupting(Sandbox._authorize.__code__,
                                   lambda frame: frame.f_locals.get("action") == sqlite3.SQLITE_INSERT, at))
        try:
            with pytest.raises(KeyboardInterrupt):
                e.call("load_batch", {"batch_id": bid})
        finally:
            sys.settrace(None)
        after = e.world.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert after == before + (e.prepared.row_count(bid) if at == "line" else 0)
        assert e.call("run_sql", {"query": "SELECT 1"})["rows"] == [[1]]  # nothing left over to raise
    finally:
        e.close()


@pytest.mark.parametrize("at", ["call", "line"])
def test_ctrl_c_while_the_grade_reads_the_mart_is_an_interrupt(prepared, at):
    """The grade reads the mart on the episode's connection: Ctrl-C raised in the authorizer there failed the
    grade with 'not authorized'; now it is Ctrl-C, after the episode is recorded where the grade went on."""
    import sqlite3
    import sys

    from gate_pipeline.kernel.engine import Session
    from gate_pipeline.kernel.sandbox import Sandbox
    session = Session(prepared[CASE], "probe")
    sys.settrace(_interrupting(Sandbox._authorize.__code__,
                               lambda frame: frame.f_locals.get("action") == sqlite3.SQLITE_SELECT
                               and not frame.f_locals["self"].guard, at))
    try:
        with pytest.raises(KeyboardInterrupt):
            session.finish()
    finally:
        sys.settrace(None)
    assert (session.result is not None) == (at == "line")


@pytest.mark.parametrize("at, times", [("call", 1), ("line", 1), ("call", 2)])
def test_ctrl_c_while_a_v2_episode_gives_its_database_back_leaves_it_as_built(at, times):
    """(A tracer is turned off by the exception it raises: two Ctrl-Cs are an authorizer that raises twice.)"""
    """A v2 episode borrows its case's database and gives it back by rolling its loads back: Ctrl-C raised in the
    authorizer as that ROLLBACK is prepared failed it, and the next episode of the case found the loads."""
    import sqlite3
    import sys
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import Sandbox
    path = Path(__file__).resolve().parents[1] / "cases" / "v2" / "eval_curated.jsonl"
    prepared = prepare(read_cases(path)[0])
    try:
        first = Session(prepared, "probe")
        count = "SELECT (SELECT count(*) FROM wh_orders) + (SELECT count(*) FROM wh_customers)"
        built = first.tools("run_sql", query=count)["rows"]
        for batch in first.tools("list_batches"):
            first.tools("load_batch", batch_id=batch["batch_id"])
        assert first.tools("run_sql", query=count)["rows"] != built
        left = [times]

        def authorize(action, arg1, *rest):
            if action == sqlite3.SQLITE_TRANSACTION and arg1 == "ROLLBACK" and left[0]:
                left[0] -= 1
                raise KeyboardInterrupt
            return sandbox._authorize(action, arg1, *rest)
        sandbox = first.episode.world.sandbox
        if times > 1:
            first.episode.world.conn.set_authorizer(authorize)
        else:
            sys.settrace(_interrupting(Sandbox._authorize.__code__,
                                       lambda frame: frame.f_locals.get("action") == sqlite3.SQLITE_TRANSACTION
                                       and frame.f_locals.get("arg1") == "ROLLBACK", at))
        try:
            with pytest.raises(KeyboardInterrupt):
                first.finish()
        finally:
            sys.settrace(None)
        second = Session(prepared, "probe")
        assert second.tools("run_sql", query=count)["rows"] == built
        second.finish()
    finally:
        prepared.close()


@pytest.mark.parametrize("at", ["call", "line"])
def test_ctrl_c_while_the_look_check_puts_a_batch_back_leaves_the_batch_whole(at):
    """v2's look check empties a batch inside a savepoint and rolls it back: Ctrl-C raised in the authorizer as the
    ROLLBACK is prepared made it fail, the agent was answered 'not authorized', and the batch stayed empty for
    the rest of the episode with the savepoint open (an outside review's fault injection). Ctrl-C now comes out
    of the tool call, with the batch whole and the savepoint released."""
    import sqlite3
    import sys
    from pathlib import Path

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import Sandbox
    path = Path(__file__).resolve().parents[1] / "cases" / "v2" / "eval_curated.jsonl"
    session = Session(prepare(read_cases(path)[0]), "probe")
    conn = session.episode.world.conn
    table = sorted(session.episode.world.sandbox.staging)[0]
    rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    sys.settrace(_interrupting(Sandbox._authorize.__code__,
                               lambda frame: frame.f_locals.get("action") == sqlite3.SQLITE_SAVEPOINT
                               and frame.f_locals.get("arg1") == "ROLLBACK", at))
    try:
        with pytest.raises(KeyboardInterrupt):
            session.tools("run_sql", query=f"SELECT count(*) FROM {table}")
    finally:
        sys.settrace(None)
    assert session.tools("run_sql", query=f"SELECT count(*) FROM {table}")["rows"] == [[rows]]
    with pytest.raises(sqlite3.OperationalError, match="no such savepoint"):
        conn.execute("RELEASE gate_looked_at")
    session.abandon("interrupted")


CTRL_C_DURING_AGENT_SQL = """
import os, signal, threading, time
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import Session, prepare
session = Session(prepare(read_cases({path!r})[0]), "probe")
session.episode.world.sandbox.step_budget = 10 ** 12  # the query runs until its 2 s; Ctrl-C comes at 0.2 s
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    answer = session.tools("run_sql", query="WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
                                            "SELECT COUNT({count}) FROM r")
    print("answered", answer)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - start, 1))
"""


@pytest.mark.parametrize("suite, count", [("classic", "*"), ("v2", "*")])
def test_ctrl_c_during_agent_sql_stops_gate_not_the_query_alone(suite, count, tmp_path):
    """Ctrl-C while an agent's query runs comes to Python inside the progress handler, where SQLite swallowed
    it and the agent was told 'interrupted' while the run played on: it is gate's KeyboardInterrupt. (Inside a
    SQL function of gate's it is gate's too where the function's body is reached: see the next test; one that
    comes before the function's first line is lost.)"""
    import subprocess
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "cases" / suite / "eval_curated.jsonl"
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_DURING_AGENT_SQL.format(path=str(path), count=count))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.stdout.startswith("interrupted after 0.2"), (p.stdout, p.stderr[-2000:])


BESIDE_BUSY_NEIGHBOURS = """
import os, subprocess, sys, time
from gate_pipeline.kernel import sandbox
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import Session, prepare
os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})  # one CPU, shared with the neighbours below
session = Session(prepare(read_cases({path!r})[0]), "probe")

class Free:  # a pacer that never holds a query: what changes is only that the thread has one, as in gate serve
    def wait(self, deadline):
        return 0.0
    def done(self):
        pass

def query(n):  # string work on n rows: much CPU for few SQLite steps
    return ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < " + str(n) + ") SELECT count(*) "
            "FROM c WHERE instr(upper(lower(upper(substr('" + "ab" * 4000 + "', x % 3)))), 'zz') > x")

def timed(q):
    wall, cpu = time.monotonic(), time.thread_time()
    answer = session.tools("run_sql", query=q)
    return answer, time.monotonic() - wall, time.thread_time() - cpu

sandbox.pace(Free())
n = 1000
for _ in range(8):  # a query of about half its 2 s budget alone
    answer, wall, cpu = timed(query(n))
    if "rows" in answer and 0.8 < cpu < 1.2:
        break
    n = max(100, int(n * (1.0 / cpu if "rows" in answer else 0.25)))
alone = answer
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
try:
    time.sleep(0.2)
    answer, wall, cpu = timed(query(n))
finally:
    for p in busy:
        p.kill()
print(answer == alone and "rows" in answer, round(wall, 2), round(cpu, 2))
"""


def test_a_paced_query_answers_beside_busy_neighbours_as_it_does_alone(tmp_path):
    """A query on a thread with a pacer (gate serve's) was timed by the clock, so one of a second came back
    `interrupted` when the machine was busy (the baton runs long queries at the lowest priority): sixteen of one
    client's, while other processes ran, lost two. It is timed by its thread's CPU time now: beside two busy
    processes on its one CPU it takes well over its 2 s of the clock and answers what it answers alone."""
    import subprocess
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "cases" / "classic" / "eval_curated.jsonl"
    script = tmp_path / "busy.py"
    script.write_text(BESIDE_BUSY_NEIGHBOURS.format(path=str(path)))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    same, wall, cpu = p.stdout.split()
    assert same == "True", (p.stdout, p.stderr[-2000:])
    assert float(wall) > 2.0 and float(cpu) < 2.0, p.stdout  # the clock passed the budget, its CPU did not


COMPILED_BESIDE_BUSY_NEIGHBOURS = """
import os, subprocess, sys, time
from gate_pipeline.kernel import sandbox
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import Session, prepare
os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})  # one CPU, shared with the check's child and the neighbours
session = Session(prepare(read_cases({path!r})[0]), "probe")
box = session.episode.world.sandbox

class Free:  # a pacer that never holds a query: only that the thread has one changes, as in gate serve
    def wait(self, deadline):
        return 0.0
    def done(self):
        pass

def doubled(levels, salt):  # CTEs each the one before twice over: SQLite expands 2 ** levels copies as it compiles
    parts = [f"a0(x) AS (SELECT {{salt}})"] + [f"a{{i}}(x) AS (SELECT x FROM a{{i - 1}} UNION ALL SELECT x FROM "
                                              f"a{{i - 1}})" for i in range(1, levels + 1)]
    return "WITH " + ", ".join(parts) + f" SELECT count(*) FROM a{{levels}} WHERE 0"

sandbox.pace(Free())
share = box.time_budget * sandbox.COMPILE_SHARE
calls = iter(range(10 ** 6))
def check(levels):  # a statement the check has not seen (its cache is by text): compiled in its child
    answer = session.tools("run_sql", query=doubled(levels, next(calls)))
    return answer, box.compile_seconds
levels, took = 8, 0.0
while levels < 20:  # a statement whose check takes about a third of its share of the budget alone, or more
    answer, took = check(levels)
    if "rows" not in answer or took > share / 3:
        break
    levels += 1
if "rows" not in answer:
    levels -= 1
alone, took = check(levels)
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
try:
    time.sleep(0.2)
    wall = time.monotonic()
    answer, cpu = check(levels)
    wall = time.monotonic() - wall
finally:
    for p in busy:
        p.kill()
print(answer == alone and "rows" in answer, round(took, 2), round(wall, 2), round(cpu, 2), round(share, 2))
"""


def test_a_paced_querys_compile_check_answers_beside_busy_neighbours_as_it_does_alone(tmp_path):
    """A paced query's compile check waited for its child by the clock: sixteen clients' statements that each took
    a third of a second to compile, checked in children of their own at once, made another client's statement
    of 45 ms come back `interrupted` nine times in ten. The check of a paced query is timed by the child's CPU
    time now: beside three busy processes on its one CPU it takes more of the clock than its share of the budget
    and answers what it answers alone."""
    import subprocess
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "cases" / "classic" / "eval_curated.jsonl"
    script = tmp_path / "busy_compile.py"
    script.write_text(COMPILED_BESIDE_BUSY_NEIGHBOURS.format(path=str(path)))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    same, alone, wall, cpu, share = p.stdout.split()
    assert same == "True", (p.stdout, p.stderr[-2000:])
    assert float(wall) > float(share) > float(cpu), p.stdout  # the clock passed its share, the child's CPU did not


def self_joined_ctes(depth: int, tail: str = "") -> str:
    """CTEs that each refer to the one before twice: SQLite expands them while it compiles the statement,
    2 ** depth copies, before one virtual-machine step runs (an outside reviewer's query: 6-7 s at 14)."""
    parts = ["c0 AS (SELECT 1 AS v)"] + [f"c{i} AS NOT MATERIALIZED (SELECT a.v FROM c{i - 1} a, c{i - 1} b "
                                         f"WHERE a.v = b.v)" for i in range(1, depth + 1)]
    return "WITH " + ", ".join(parts) + f" SELECT count(*) FROM c{depth}{tail}"


def repeated_columns(depth: int, copies: int, tail: str = "") -> str:
    """Subqueries whose column is repeated inside each other: copies ** depth terms once flattened (at 6 and 20,
    367 characters, SQLite compiled for 41 s, asking the authorizer almost never)."""
    query = "SELECT 1 AS a"
    for _ in range(depth):
        query = f"SELECT {'+'.join(['a'] * copies)} AS a FROM ({query}{tail})"
    return query


def doubling_ctes(depth: int) -> str:
    parts = ["c0 AS (SELECT 1 AS a)"] + [f"c{i} AS (SELECT a+a AS a FROM c{i - 1})" for i in range(1, depth + 1)]
    return "WITH " + ", ".join(parts) + f" SELECT a FROM c{depth}"


def one_select(n: int, m: int, k: int) -> str:
    """One SELECT whose alias (n terms) SQLite copies m times into its WHERE clause, planned once per branch
    of a k-way OR (a reviewer's: 18 s and 873 MB at 1400, 1400, 340, asking the authorizer never)."""
    ors = "rowid IN (0, 0) OR " + " OR ".join(f"rowid = {i}" for i in range(k))
    return (f"SELECT 0 IN ({','.join(['0'] * n)}) AS x FROM wh_orders WHERE ({ors}) "
            f"AND amount > (1 IN ({','.join(['x'] * m)}))")


def propagated_constants(copies: int, names: str = "abcdef", table: str = "wh_orders") -> str:
    """One short SELECT (no subquery) whose WHERE chains equalities: SQLite's constant propagation puts a copy of
    each column's constant into every use of it, level after level, copies ** 6 terms (an outside reviewer's: at
    12 copies, 280 characters, 2.4 s and 1.2 GB compiling in the main process, where a short single SELECT
    skipped the check; 55 s and 10.5 GB at 300 characters on a v2 case)."""
    a, b, c, d, e, f = names
    chain = " and ".join(f"{y}={'+'.join([x] * copies)}" for x, y in zip(f"{a}{b}{c}{d}{e}{f}", f"{b}{c}{d}{e}{f}"))
    return (f"select oid {a},amount {b},status {c},currency {d},order_id {e},order_date {f} from {table} "
            f"where {a}=1 and {chain} and customer_id={'+'.join([f] * copies)}")


HEAVY_TO_COMPILE = {"self-joined CTEs": self_joined_ctes(20), "repeated columns": repeated_columns(6, 20),
                    "doubling CTEs": doubling_ctes(30), "explained": "EXPLAIN " + repeated_columns(13, 4),
                    "one select": one_select(1200, 1200, 300), "propagated constants": propagated_constants(12)}


def test_a_short_single_select_that_chains_equalities_is_compiled_in_the_check():
    """A statement that could chain equalities through SQLite's constant propagation does not skip the check for
    being short: one naming two or more of `=`, `IS` and `IN` (`x IN (y)` is `x = y`) goes to the child."""
    from gate_pipeline.kernel.compile_check import SHORT, may_grow
    assert len(propagated_constants(12)) <= SHORT and may_grow(propagated_constants(12))
    for grows in ("SELECT 1 FROM t WHERE a = 1 AND b = a", "SELECT 1 FROM t WHERE a==b", "SELECT 1 FROM t WHERE a=1 AND b IS a",
                  "SELECT 1 FROM t WHERE a IS NOT b AND c=d", "SELECT 1 FROM t WHERE a in(b) and c in(a)",
                  "select 1 from t where a/**/IN/**/(b)/**/and/**/c/**/in/**/(a)", "SELECT 1 FROM t WHERE a='x'IN('x')",
                  "SELECT 1 FROM t WHERE a IS\tb AND c IS a", "SELECT 1 FROM t WHERE a = '=' "):
        assert may_grow(grows), grows
    for short in ("SELECT * FROM t WHERE rowid > 150 ORDER BY rowid LIMIT 50", "SELECT 1 FROM t WHERE a IS NULL",
                  "SELECT 1 FROM t WHERE a IS NOT NULL OR b <> 'x' OR c >= 1 OR d <= 2 OR e != 3 OR f = 'y'",
                  "SELECT min(x), isnull(y), in_stock FROM t", "SELECT 1 FROM t WHERE a ISNULL OR b NOTNULL OR c IN (1, 2)"):
        assert not may_grow(short), short


def windows(count: int, copies: int, lower: bool) -> str:
    """A CTE of `count` windows ordered by literals that differ only in their letters' case (SQLite compares
    literals with their case: `count` windows, each a subquery layer over the ones before, about count ** 2.8),
    compiled again for each of `copies` arms; `lower`: the same statement in lower case (one window, quick)."""
    width = max(1, (count - 1).bit_length())
    literal = ["".join(c.upper() if (i >> j) & 1 and not lower else c for j, c in enumerate("a" * width))
               for i in range(count)]
    over = [f"rank()over(order by'{text}')" for text in literal]
    body = "max(" + ",".join(f"max({','.join(over[j:j + 120])})" for j in range(0, count, 120)) + ")"
    return f"with c as not materialized(select {body} m from wh_orders)" + " union all ".join(["select m from c"] * copies)


def test_a_statement_the_check_passed_does_not_let_its_twin_in_literal_case_skip_it(ep):
    """An outside reviewer's: the check's cache key had the statement's ASCII letters in lower case, as SQLite reads
    names and keywords, but SQLite compares literals with their case, so the two statements below were one key: the
    lower-case one makes one window (0.03 s), the other 250 (7.5 s alone). Once the first was checked, the second
    skipped the check and compiled in the main process until the authorizer saw the budget spent (2.1 s)."""
    light, heavy = windows(250, 64, lower=True), windows(250, 64, lower=False)
    assert light == heavy.lower() and len(heavy) < 10_000
    assert "rows" in ep.call("run_sql", {"query": light})
    start = time.monotonic()
    assert ep.call("run_sql", {"query": heavy}) == {"error": "interrupted"}
    assert time.monotonic() - start < 1.5  # the check's share of the budget (0.5 s), not the whole budget


def test_a_statement_that_failed_in_the_check_is_not_remembered_for_the_next_case():
    """An outside reviewer's: a statement naming the next case's table in upper case failed at once in this case's
    check (no such table), was remembered as passed, and in the next case, whose schema is this one under other
    names, it skipped the check: SQLite reads the name in any case, and the chain compiled in the main process
    (6.5 s, 2 GB). A statement that fails in the check passes (it fails as fast in the database) unremembered."""
    from conftest import ROOT

    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import prepare
    first, second = (prepare(c) for c in read_cases(ROOT / "cases" / "classic" / "train_procedural.jsonl")[:2])
    table = next(b["staging_table"] for b in second.listing if b["table"] == "orders")
    heavy = propagated_constants(12, table=table.upper())
    here, there = first.suite.episode(first), second.suite.episode(second)
    try:
        assert "no such table" in here.call("run_sql", {"query": heavy})["error"]
        start = time.monotonic()
        assert there.call("run_sql", {"query": heavy}) == {"error": "interrupted"}
        assert time.monotonic() - start < 1.5
    finally:
        here.close()
        there.close()


def test_one_equality_grows_a_short_statement_no_further_than_a_product_of_four_parts(ep):
    """One equality copies one part of the text (an alias of constants) into each use of a column other parts
    name (an alias of the column's uses, used again): at 300 characters that compiles in a fraction of a second
    (an outside reviewer's best, this one: 0.19 s), so it may skip the check."""
    from gate_pipeline.kernel.compile_check import may_grow
    q = (f"select {'+'.join(['1'] * 32)} x,{'+'.join(['oid'] * 16)} y from wh_orders where oid={'+'.join(['x'] * 32)}"
         f" and {'+'.join(['y'] * 32)}>0")
    assert len(q) <= 300 and not may_grow(q)
    start = time.monotonic()
    assert ep.call("run_sql", {"query": q})["rows"] == []
    assert time.monotonic() - start < 1.0


def test_a_statement_the_check_passed_does_not_let_its_non_ascii_case_twin_skip_it(ep):
    """The check's cache was keyed by the statement in lower case (Python's, which lowers `Ä` too), so the two
    statements below were one key: SQLite reads `Ä` and `ä` as two names (the statement chains six of them) and
    the lower-case one as three names twice (no chain, fast), so once the fast one was checked, the other skipped
    the check and compiled in the main process (2.3 s). The key keeps the statement's case now."""
    heavy = propagated_constants(12, "ÄäÖöÜü") + " and 1=1" * 5  # over SHORT (the same with a short one)
    light = heavy.lower()
    assert light != heavy and len(heavy) > 300
    assert "rows" in ep.call("run_sql", {"query": light})
    start = time.monotonic()
    assert ep.call("run_sql", {"query": heavy}) == {"error": "interrupted"}
    assert time.monotonic() - start <= ep.world.sandbox.time_budget + 0.5


@pytest.mark.parametrize("name", sorted(HEAVY_TO_COMPILE))
def test_compiling_is_bounded_by_the_time_budget(ep, name):
    start = time.monotonic()
    assert ep.call("run_sql", {"query": HEAVY_TO_COMPILE[name]}) == {"error": "interrupted"}
    assert time.monotonic() - start <= ep.world.sandbox.time_budget + 0.5
    assert ep.ledger.entries[-1]["note"] == "OperationalError"
    assert ep.call("run_sql", {"query": "SELECT 1"})["rows"] == [[1]]  # the connection is fine afterwards
    # and a statement with subqueries compiles as before once the check's child is started again
    assert ep.call("run_sql", {"query": "SELECT (SELECT 2) + (SELECT 3)"})["rows"] == [[5]]


def test_value_length_limit(ep):
    q = ("WITH RECURSIVE r(s) AS (SELECT 'xxxxxxxxxx' UNION ALL SELECT s || s FROM r WHERE length(s) < 100000) "
         "SELECT length(s) FROM r")
    assert ep.call("run_sql", {"query": q}) == {"error": "string or blob too big"}
    assert ep.call("run_sql", {"query": "SELECT printf('%.*c', 30000, 'x')"}) == {
        "error": "not authorized to use function: printf"}  # one uninterruptible step: refused, see below


def test_like_pattern_limit(ep):
    q = f"SELECT 1 WHERE 'a' LIKE '{'a' * 201}'"
    assert ep.call("run_sql", {"query": q}) == {"error": "LIKE or GLOB pattern too complex"}
    assert "rows" in ep.call("run_sql", {"query": f"SELECT 1 WHERE 'a' LIKE '{'%' * 200}'"})


def test_column_limit(ep):
    q = "SELECT " + ", ".join(str(i) for i in range(65))
    assert ep.call("run_sql", {"query": q}) == {"error": "too many columns in result set"}
    assert len(ep.call("run_sql", {"query": "SELECT " + ", ".join(str(i) for i in range(64))})["columns"]) == 64


def test_limits_do_not_outlive_the_query(ep):
    ep.call("run_sql", {"query": "SELECT 1"})
    assert ep.world.conn.execute("SELECT length(printf('%.*c', 30000, 'x'))").fetchone() == (30000,)


def test_result_shaping(ep):
    r = ep.call("run_sql", {"query": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r WHERE n < 60) SELECT n FROM r"})
    assert len(r["rows"]) == 50 and r["truncated"] is True and r["columns"] == ["n"]
    r = ep.call("run_sql", {"query": "SELECT 1 UNION ALL SELECT 2"})
    assert r == {"columns": ["1"], "rows": [[1], [2]], "truncated": False}
    long = "WITH RECURSIVE r(s) AS (SELECT 'y' UNION ALL SELECT s || 'y' FROM r WHERE length(s) < 300) SELECT max(s)"
    r = ep.call("run_sql", {"query": f"SELECT ({long} FROM r), x'00ff', 1e999, -1e999"})
    cell, blob, inf, ninf = r["rows"][0]
    assert cell == "y" * 200 + "...[truncated]" and blob == "0x00ff" and (inf, ninf) == ("inf", "-inf")


def test_query_normalisation_and_empty_query(ep):
    assert ep.call("run_sql", {"query": "  SELECT 1;;  "})["rows"] == [[1]]
    assert ep.ledger.entries[-1]["args"]["query"] == "SELECT 1"
    assert ep.call("run_sql", {"query": ""}) == {"columns": [], "rows": [], "truncated": False}
    assert ep.ledger.entries[-1]["args"] == {"query": "", "tables_read": []} and ep.ledger.entries[-1]["executed"]


def test_tables_read_come_from_sqlite_not_the_text(ep):
    s = stg(ep)
    ep.call("run_sql", {"query": f"SELECT 1 -- {s}"})
    assert ep.ledger.entries[-1]["args"]["tables_read"] == []
    ep.call("run_sql", {"query": f"SELECT '{s}'"})
    assert ep.ledger.entries[-1]["args"]["tables_read"] == []
    ep.call("run_sql", {"query": f"SELECT 1 FROM {s} WHERE 0"})
    assert ep.ledger.entries[-1]["args"]["tables_read"] == [s]
    ep.call("run_sql", {"query": f"SELECT s.amount FROM {s} s JOIN wh_orders w ON s.order_id = w.order_id"})
    assert ep.ledger.entries[-1]["args"]["tables_read"] == sorted([s, "wh_orders"])


def test_tables_read_recorded_on_every_execution(ep):
    q = f"SELECT COUNT(*) FROM {stg(ep)}"
    ep.call("run_sql", {"query": q})
    ep.call("run_sql", {"query": q})
    assert [e["args"]["tables_read"] for e in ep.ledger.entries[-2:]] == [[stg(ep)], [stg(ep)]]


def test_sql_errors_come_back_as_tool_errors(ep):
    r = ep.call("run_sql", {"query": "SELEC 1"})
    assert "syntax error" in r["error"] and ep.ledger.entries[-1]["note"] == "OperationalError"
    r = ep.call("run_sql", {"query": "SELECT nope FROM wh_orders"})
    assert r == {"error": "no such column: nope"}
    r = ep.call("run_sql", {"query": "SELECT 1\x00"})
    assert "error" in r


@pytest.mark.parametrize("query,error", [("SELECT (SELECT 1)\x00", "the query contains a null character"),
                                         ("SELECT (SELECT '\ud800')", "surrogates not allowed")])
def test_text_sqlite_is_never_given_is_refused_as_ever_through_the_compile_check(ep, query, error):
    assert error in ep.call("run_sql", {"query": query})["error"]
    assert ep.call("run_sql", {"query": "SELECT (SELECT 2) + (SELECT 3)"})["rows"] == [[5]]


def _db(tables: dict[str, str]):
    import sqlite3
    conn = sqlite3.connect(":memory:")
    for name, columns in tables.items():
        conn.execute(f"CREATE TABLE {name} ({columns})")
    return conn


def test_the_compile_check_works_with_descriptors_numbered_past_1024():
    """`gate serve` raises its open-files limit and holds many connections, so the compile check's pipes may be
    numbered 1,024 or more, which select() refuses: every statement with a subquery came back "filedescriptor out
    of range in select()" as the agent's own error. The check now waits with poll."""
    import resource

    from gate_pipeline.kernel.compile_check import CompileCheck
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the open-files limit here cannot reach 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    taken = []
    try:
        while not taken or taken[-1] < 1100:  # every lower number taken: the child's pipes get higher ones
            taken.append(os.open(os.devnull, os.O_RDONLY))
        check = CompileCheck()
        try:
            db = _db({"wh_orders": "order_id TEXT", "stg_b_1": "order_id TEXT"})
            assert check.compiles_within(db, "SELECT (SELECT 1) FROM stg_b_1", 1.0)
            assert check._child.stdout.fileno() > 1024
            assert not check.compiles_within(db, HEAVY_TO_COMPILE["doubling CTEs"], 0.2)
        finally:
            check.close()
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_statement_that_compiled_in_time_is_not_compiled_again_for_the_same_schema_under_other_names():
    """The compile check remembers what passed by the statement and schema with every name replaced by its
    place: the next episode's database (other batch ids, the same tables) needs no child; another schema,
    another statement, the same statement in another case (SQLite compares literals with their case) or a
    statement that failed does."""
    from gate_pipeline.kernel.compile_check import CompileCheck
    check = CompileCheck()
    try:
        one = _db({"wh_orders": "order_id TEXT, amount REAL", "stg_b_1": "order_id TEXT, amount TEXT"})
        two = _db({"wh_orders": "order_id TEXT, amount REAL", "stg_b_7": "order_id TEXT, amount TEXT"})
        query = "SELECT COUNT(*) FROM {t} WHERE order_id IN (SELECT order_id FROM wh_orders) AND '{t}' <> ''"
        assert check.compiles_within(one, query.format(t="stg_b_1"), 1.0)
        check.close()  # no child any more: a statement that needs one starts it again
        assert check.compiles_within(two, query.format(t="stg_b_7"), 1.0) and check._child is None
        assert check.compiles_within(two, query.format(t="stg_b_7") + " AND 1", 1.0) and check._child is not None
        check.close()
        assert check.compiles_within(two, query.format(t="STG_B_7"), 1.0) and check._child is not None
        check.close()
        other = _db({"wh_orders": "order_id TEXT, amount REAL", "stg_b_7": "order_id TEXT, amount TEXT, note TEXT"})
        assert check.compiles_within(other, query.format(t="stg_b_7"), 1.0) and check._child is not None
        check.close()
        assert not check.compiles_within(two, HEAVY_TO_COMPILE["doubling CTEs"], 0.2)
        assert not check.compiles_within(two, HEAVY_TO_COMPILE["doubling CTEs"], 0.2) and check._child is None
        quoted = _db({'"stg b 1"': "order_id TEXT"})  # any name: "stg b 1" and "stg b 2" are each one place
        assert check.compiles_within(quoted, 'SELECT (SELECT 1) FROM "stg b 1"', 1.0)
        check.close()
        assert check.compiles_within(_db({'"stg b 2"': "order_id TEXT"}), 'SELECT (SELECT 1) FROM "stg b 2"', 1.0)
        assert check._child is None
    finally:
        check.close()


def test_compile_check_children_outlive_the_threads_that_used_them():
    """A server's threads come and go (gate serve replaces a thread whose call ran long): a child that compiled
    for one thread compiles for the next, and `warm` has children running before any statement needs one."""
    import sqlite3
    import threading

    from gate_pipeline.kernel import compile_check
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.execute("CREATE TABLE t (a)")
    children = []

    def compile_one(k):  # another statement each time: none remembered as compiled already
        with compile_check.borrowed() as check:
            assert check.compiles_within(conn, f"SELECT (SELECT a FROM t) + {k}", 5.0)
            children.append(check._child.pid)

    for k in range(3):
        thread = threading.Thread(target=compile_one, args=(k,))
        thread.start()
        thread.join()
    assert len(children) == 3 and len(set(children)) == 1, children
    # at this process's priority: the check's budget is wall time, and at a lower one a legitimate statement's
    # check took about ten times longer beside each busy thread (refused beside eight), so load changed results
    assert os.getpriority(os.PRIO_PROCESS, children[0]) == os.getpriority(os.PRIO_PROCESS, 0)
    compile_check.warm(3)
    with compile_check._IDLE_LOCK:
        assert sum(c.running() for c in compile_check._IDLE) >= 3


def test_rows_as_json_shapes_every_mix_of_values_as_cell_does():
    """The quick column checks (text joined, numbers summed) leave exactly what `cell` leaves, and hand
    everything else to it: long text, bytes, NaN and infinities, NULLs, sums that overflow."""
    import random

    from gate_pipeline.kernel.sandbox import MAX_CELL, cell, rows_as_json
    values = [None, 0, 1, -5, 2**62, 1.5, float("inf"), float("-inf"), float("nan"), 1e308, "", "x", "y" * MAX_CELL,
              "z" * (MAX_CELL + 1), b"ab", b""]
    draw = random.Random(7)
    for _ in range(5000):
        width, height = draw.randint(1, 4), draw.randint(1, 6)
        rows = [tuple(draw.choice(values) for _ in range(width)) for _ in range(height)]
        assert repr(rows_as_json(rows)) == repr([[cell(v) for v in row] for row in rows]), rows


def test_a_classic_episode_is_given_its_databases_catalogue_as_sqlite_keeps_it(prepared):
    """A classic episode's sandbox starts with the catalogue its prepared case made from the statements that
    built the image, rather than reading it from each episode's copy: for every shipped case it is exactly
    what SQLite's sqlite_master holds, in order, and a statement of gate's own that changes the schema
    still drops it."""
    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.compile_check import catalogue
    from gate_pipeline.kernel.engine import prepare
    from gate_pipeline.kernel.settings import Settings
    settings = Settings.from_env()
    cases = [*read_cases(settings.cases_file("eval")), *read_cases(settings.cases_file("train"))]
    for case in cases:
        p = prepare(case)
        ep = p.suite.episode(p)
        try:
            assert ep.world.sandbox._catalogue is p.catalogue
            assert catalogue(ep.world.conn) == p.catalogue, case.case_id
        finally:
            ep.close()
            p.close()
    p = prepared[CASE]
    ep = p.suite.episode(p)
    try:
        ep.world.conn.execute("CREATE TABLE gate_own (a)")
        assert ep.world.sandbox._catalogue is None
        assert ep.call("run_sql", {"query": "SELECT (SELECT COUNT(*) FROM gate_own)"})["rows"] == [[0]]
        assert ep.world.sandbox._catalogue == catalogue(ep.world.conn) != p.catalogue
    finally:
        ep.close()


def test_a_compile_check_interrupted_while_it_waits_never_hands_its_answer_to_the_next_statement():
    """An exception raised while the check waits for the child's answer (here a signal's) ends that child:
    the answer to the interrupted statement is never read as the next one's."""
    import signal

    from gate_pipeline.kernel.compile_check import CompileCheck

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    check = CompileCheck()
    db = _db({"wh_orders": "order_id TEXT, amount REAL"})
    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert check.compiles_within(db, "SELECT (SELECT 1)", 5.0)  # the child started and answered
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            check.compiles_within(db, HEAVY_TO_COMPILE["doubling CTEs"], 30.0)
        assert check._child is None
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert not check.compiles_within(db, HEAVY_TO_COMPILE["doubling CTEs"], 0.2)  # its own answer: none
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        check.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_compile_checks_child_goes_with_the_process_that_started_it():
    """A compile-check child compiling a statement that takes minutes went on compiling, at full CPU and up to its
    2 GiB, after the process that started it was killed (a worker SIGKILLed when gate stopped): it heard of the
    end only at its next read of stdin (an outside review's: 30 s at 95 % CPU)."""
    import signal
    import subprocess
    code = ("import sqlite3, sys\n"
            "from gate_pipeline.kernel.compile_check import CompileCheck\n"
            "conn = sqlite3.connect(':memory:')\n"
            f"CompileCheck().compiles_within(conn, {doubling_ctes(30)!r}, 120)\n")
    starter = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        child = None
        while child is None and time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-P", str(starter.pid)], capture_output=True, text=True).stdout.split()
            child = int(found[0]) if found else None
            time.sleep(0.1)
        assert child is not None, "no compile-check child started"
        time.sleep(1.0)  # compiling
        assert os.path.exists(f"/proc/{child}")
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.1)
        gone = not os.path.exists(f"/proc/{child}") or " Z " in open(f"/proc/{child}/stat").read()
        if not gone:
            os.kill(child, signal.SIGKILL)
        assert gone, "the compile-check child compiles on for nobody"
    finally:
        if starter.poll() is None:
            starter.kill()


def test_no_compile_check_process_is_the_machines_failure_not_an_unchecked_statement(monkeypatch):
    """A statement that may take long to compile was let through unchecked when the check's process could not
    start (out of processes or descriptors): one of HEAVY_TO_COMPILE then held the episode for minutes. Now
    the episode is the machine's failure (NoRoom: no result, as a full disk's), and a statement that needs no
    check still runs."""
    import subprocess
    from pathlib import Path

    from gate_pipeline.kernel import compile_check
    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.errors import NoRoom

    def no_process(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(compile_check, "_IDLE", [])
    monkeypatch.setattr(subprocess, "Popen", no_process)
    prepared = prepare(read_cases(Path(__file__).resolve().parents[1] / "cases" / "classic" / "eval_curated.jsonl")[0])
    session = Session(prepared, "test")
    assert session.step({"tool": "run_sql", "args": {"query": "SELECT COUNT(*) FROM wh_orders"}}).result["rows"]
    t0 = time.perf_counter()
    with pytest.raises(NoRoom, match="could not start the process that compiles a statement first"):
        session.step({"tool": "run_sql", "args": {"query": HEAVY_TO_COMPILE["doubling CTEs"]}})
    assert time.perf_counter() - t0 < 1.0 and session.failure is not None
    with pytest.raises(NoRoom):
        session.finish()
    prepared.close()
