"""The read-only SQL sandbox behind `run_sql`: an authorizer, a step and time budget, limits.

One authorizer and one progress handler are installed per connection and switched on only
while agent SQL runs (`guard`), so gate's own loader can still write. While on, only reads
pass; every table SQLite resolves the query against is recorded, on every execution (the
statement cache is off), which is what `inspected` is graded from.

The budgets hold whatever the query: SQLite checks the progress handler between virtual-machine
steps, so a function that does unbounded work inside one step cannot be interrupted; those are
refused (`printf` and its alias `format`: `printf('%.*c', 1000000000, 'x')` fills a billion
characters before the length limit is checked). Query text is limited (MAX_QUERY_CHARS), so
parsing is bounded too; longer text is refused before SQLite sees it. Compiling is bounded by the
time budget as well: the progress handler does not run while SQLite prepares a statement (nested
CTEs that refer to each other twice take seconds to expand), but the authorizer is called all
through it, and once the deadline has passed it refuses, which ends the compilation as
`interrupted`, the same answer as a query stopped while running. Where SQLite works long between
two authorizer calls (statements that grow exponentially as they are expanded), a statement with
a subquery is compiled first in a child process that can be killed (`compile_check.py`); on a database gate
did not build (a stored one: its views may grow so however short the query) every statement is. The schema
it is compiled on is read once, and again after any statement of gate's own that may change it (the
authorizer sees every statement prepared on the connection; a guarded connection's database is never
replaced whole).

What Python raises inside the authorizer, the progress handler or a suite's SQL function (Ctrl-C's
KeyboardInterrupt comes there while a statement runs) SQLite swallows: it is kept (`_SWALLOWED`), agent
SQL stops, gate's own statements on the connection (loads, the look check's savepoints, the grade's mart)
go on, and it is raised again (`raise_swallowed`) by `execute` and after every tool call and grade: it is
gate's, never an `interrupted` answer to the agent, nor an agent's error, while the run plays on.

A server that runs many episodes' queries on its threads can give a thread a *pacer* (`pace`): at
every progress check of agent SQL on that thread it may hold the query (a wait that lets go of the GIL
and uses no CPU) for its turn; `gate serve` uses it to run one long query at a time
(`integrations/openenv_lanes.py`). A query on such a thread is timed by the CPU time its thread uses,
not by the clock: neither its waits for its turn nor what the machine runs meanwhile (other sessions'
steps, at a higher priority than a long query's) count against its time budget, so what a query answers
does not depend on how many other sessions' queries it waited for or ran beside (a query of 0.45 s alone
came back `interrupted` beside eight sessions running budget-long ones; one of a second, among sixteen
of one client's, while the machine was busy). It may take its budget and MAX_WAIT_S of the clock in all;
a query still running or waiting then is stopped by its budget as ever. Gate's own runs after it (suite v2's
look check runs the read again) start in the turn it ended in (`one_turn`), with what is left of its
budget and a wait of MAX_WAIT_S of their own: they shared the read's before, and on a loaded server the
read's waits had used it up, so the check could not decide. A read that may look at a batch can so take
its budget and MAX_WAIT_S of the clock twice over.
In process no thread has one, and a query's time is the clock's.

A suite changes the sandbox through a subclass: its budgets (`step_budget`, `time_budget`), more
functions it refuses (`denied`), and `after_read`, called after each successful read with its
rows, whose answer (extra fields for the ledger entry) the tool records.
"""
from __future__ import annotations

import math
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol

from .compile_check import catalogue, give, may_grow, take

MAX_ROWS = 50
MAX_CELL = 200
MAX_QUERY_CHARS = 10_000
STEP_BUDGET = 2_000_000
TIME_BUDGET_S = 2.0
INTERVAL = 1000  # virtual-machine steps between two calls of the progress handler
COMPILE_SHARE = 0.25  # of the time budget: what compiling in the child may take
MAX_WAIT_S = 30.0  # what a query may wait for its turn under a pacer, beyond its time budget
LIMITS = {  # (limit id, value while agent SQL runs)
    "length": (sqlite3.SQLITE_LIMIT_LENGTH, 20_000),
    "like_pattern": (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 200),
    "columns": (sqlite3.SQLITE_LIMIT_COLUMN, 64),
    "sql_length": (sqlite3.SQLITE_LIMIT_SQL_LENGTH, 4 * MAX_QUERY_CHARS),  # bytes of UTF-8
}
ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                             sqlite3.SQLITE_RECURSIVE})
DENIED_FUNCTIONS = frozenset({"zeroblob", "randomblob", "load_extension", "printf", "format"})
LEDGER_QUERY_CHARS = 1_000  # what the ledger keeps of a query refused for its length
_AGENT_LIMITS = tuple(LIMITS.values())  # (limit id, value) pairs, as the compile check takes them
_OK, _DENY, _READ, _FUNCTION = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION
_monotonic = time.monotonic
_thread_time = time.thread_time
# what gate's own statements do that leaves the schema as it was (anything else may change it: CREATE, DROP,
# ALTER, PRAGMA, ATTACH...)
_KEEPS_SCHEMA = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
                           sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE,
                           sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT})
CAUGHT = (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError)


@dataclass(slots=True)  # made at every execution and read at every authorizer call: slots, not frozen (never
class BudgetEnd:        # changed once made), which is the cheapest of the two to make and to read
    """Where an execution's time budget ends (`Sandbox.end`, set by `execute`): a paced query's time is the CPU
    time its thread used (waiting for its turn uses none), up to a wall-clock limit (`cap`), whatever else the
    machine ran meanwhile: its budget ends at a thread CPU time (`cpu`) or at `cap`, whichever comes first. Any
    other's time is the clock's: its budget ends at `clock` (and `cpu`, never read, is 0)."""
    paced: bool
    clock: float
    cpu: float
    cap: float

    def left(self) -> float:
        """Seconds of the budget left now, by the execution's own clock (on the thread that ran it); below 0
        once it is spent. Asked at every authorizer call of agent SQL: kept to a branch and one or two clocks."""
        if self.paced:
            return min(self.cpu - _thread_time(), self.cap - _monotonic())
        return self.clock - _monotonic()

    def budget_left(self) -> float:
        """Seconds left of the budget itself: a paced query's CPU time, its wall-clock cap aside (what it waited
        for its turn is no part of it); any other's clock. What a run of gate's own after it may take (v2's
        look check), with a wait of its own for its turn."""
        return self.cpu - _thread_time() if self.paced else self.clock - _monotonic()


_UNSET = BudgetEnd(False, 0.0, 0.0, 0.0)  # before the first execution: spent


class Pacer(Protocol):
    def wait(self, deadline: float) -> float:
        """At a progress check of agent SQL on this thread: return when the query may go on (by `deadline`,
        a time.monotonic() value, at the latest), with the seconds it waited (a paced query's budget is its
        thread's CPU time, which waiting does not use)."""

    def done(self) -> None:
        """The query has ended (its result read, or its error raised)."""


_PACING = threading.local()
FUNCTION_RAISED = "user-defined function raised exception"  # SQLite's error when a Python function raised


class _Swallowed(threading.local):
    """What Python raised inside SQLite on this thread, which SQLite swallows (it stops or fails the statement,
    or, for gate's own, lets it finish: see `Sandbox`) and Python forgets."""
    pending: BaseException | None = None  # no query's error (a signal's exception): to be raised again


_SWALLOWED = _Swallowed()


def _keep(exc: BaseException) -> None:
    if _SWALLOWED.pending is None:
        _SWALLOWED.pending = exc


def sql_function(fn):
    """`fn` as a SQL function of a guarded connection is to be given (`create_function`): an error of its own
    (an Exception) stays the query's error; anything else it raises (Ctrl-C's KeyboardInterrupt) is kept,
    and raised again by gate (`raise_swallowed`)."""
    def call(*args):
        try:
            return fn(*args)
        except Exception:
            raise
        except BaseException as exc:
            _keep(exc)
            raise
    call.__name__ = getattr(fn, "__name__", "sql_function")
    return call


def _an_interrupt(error: str, decided: bool, own: bool = False) -> bool:
    """Whether SQLite's error (its text) is what an exception raised before the first line of a callback leaves
    (Ctrl-C's, whose KeyboardInterrupt nothing kept): a stop or refusal no callback `decided`; for a statement
    of gate's `own` (whose functions never fail: they are given gate's values), a SQL function's failure too.
    Not for agent SQL: SQLite gives those words when it cannot hand a function its arguments (text that is not
    UTF-8, which an agent's query can make), before the function runs; a Ctrl-C that comes before a
    function's first line in agent SQL is lost (the next one stops gate)."""
    return not decided and (stopped_by_a_callback(error) or (own and error == FUNCTION_RAISED))


def raise_swallowed(error: BaseException | None = None) -> None:
    """Raise again what SQLite swallowed on this thread that is no query's error, if anything. `error`: the
    sqlite3 error of a statement of gate's own on a guarded connection (never refused, stopped or failed by
    a function's own error): one in the words an exception inside a callback or function leaves is taken for
    Ctrl-C (KeyboardInterrupt)."""
    pending = _SWALLOWED.pending
    if pending is not None:
        _SWALLOWED.pending = None
        raise pending from None
    if error is not None and _an_interrupt(str(error), decided=False, own=True):
        raise KeyboardInterrupt


def pace(pacer: Pacer | None) -> None:
    """Give the agent SQL this thread runs a pacer from now on (None: none, as in process)."""
    _PACING.pacer = pacer


@contextmanager
def gates_own():
    """A block of gate's own statements on a guarded connection (never refused, stopped or failed by a function):
    a sqlite3 error in the words Ctrl-C leaves inside the callbacks is Ctrl-C (`raise_swallowed`)."""
    try:
        yield
    except sqlite3.Error as exc:
        raise_swallowed(exc)
        raise


def stopped_by_a_callback(error: str) -> bool:
    """Whether SQLite's error is one a callback's stop or refusal gives (exactly: text the data chose, a table
    named "not authorized", makes other errors)."""
    return (error == "interrupted" or error == "not authorized" or error.startswith("not authorized to use function: ")
            or (error.startswith("access to ") and error.endswith(" is prohibited")))


def own_statement(conn: sqlite3.Connection, sql: str, must: bool = False) -> None:
    """One statement of gate's own on a guarded connection: never refused or stopped, so a failure in those
    words is Ctrl-C's (`raise_swallowed`), which may not be answered to the agent as its query's error.
    `must`: a statement that puts the database back, made again (the interrupt spent) before Ctrl-C goes on,
    so that whatever goes on after it (the next episode of a shared database) finds the data as it was."""
    try:
        conn.execute(sql).close()
    except sqlite3.Error as exc:
        try:
            raise_swallowed(exc)
        except BaseException:  # Ctrl-C's: the statement is made before it goes on
            if must:
                _until_made(conn, sql)
            raise
        raise


def _until_made(conn: sqlite3.Connection, sql: str, tries: int = 100) -> None:
    """`sql` made again, however many more Ctrl-Cs fail it (each spent as it fails it)."""
    for _ in range(tries - 1):
        try:
            conn.execute(sql).close()
            return
        except sqlite3.Error as exc:
            if not _an_interrupt(str(exc), decided=False, own=True):
                raise
            _SWALLOWED.pending = None
    conn.execute(sql).close()


def normalise_query(query: str) -> str:
    return query.strip().rstrip(";")


def too_long(query: str) -> str | None:
    """The refusal for query text over MAX_QUERY_CHARS, or None."""
    if len(query) > MAX_QUERY_CHARS:
        return f"query is {len(query):,} characters long; the limit is {MAX_QUERY_CHARS:,}"
    return None


def bounded(query: str) -> str:
    """A refused long query as the ledger keeps it: its start and its length."""
    return f"{query[:LEDGER_QUERY_CHARS]}...[{len(query):,} characters]"


def cell(value):
    """One value as a result row shows it: bytes as hex, NaN and infinities as text, long text cut."""
    if isinstance(value, bytes):
        return "0x" + value[:100].hex()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if isinstance(value, str) and len(value) > MAX_CELL:
        return value[:MAX_CELL] + "...[truncated]"
    return value


def _plain_column(column: tuple) -> bool:
    """A quick True for a column `cell` leaves as it is: all text of at most MAX_CELL characters (joined
    by C, which refuses anything but text), or all finite numbers (a sum is finite only when every
    term is); False when it cannot tell so quickly."""
    kind = type(column[0])
    try:
        if kind is str:
            return len("".join(column)) <= MAX_CELL or max(map(len, column)) <= MAX_CELL
        if kind is int or kind is float:
            return math.isfinite(sum(column))
    except (TypeError, OverflowError):
        pass
    return False


def rows_as_json(fetched: list[tuple]) -> list[list]:
    """The rows as `cell` shapes them, the common cases decided column by column in C (text of at most
    MAX_CELL characters, integers, finite floats, NULLs) instead of cell by cell."""
    if not fetched:
        return []
    for column in zip(*fetched):
        if _plain_column(column):
            continue
        kinds = set(map(type, column))
        if kinds <= {str}:
            if max(map(len, column)) > MAX_CELL:
                break
        elif not kinds <= {int, type(None)}:
            if kinds <= {float, int, type(None)} and all(map(math.isfinite, (v for v in column if v is not None))):
                continue
            break
    else:
        return list(map(list, fetched))
    return [[cell(v) for v in row] for row in fetched]


class Sandbox:
    """Guards one connection. `run(query)` returns (result, tables read, the ledger's extra fields) or
    raises a CAUGHT error."""

    denied: frozenset[str] = DENIED_FUNCTIONS
    denied_tables: frozenset[str] = frozenset()  # tables a read may not name (lower case)
    deny_temp = False  # whether a read of the temporary schema is refused

    def __init__(self, conn: sqlite3.Connection, step_budget: int = STEP_BUDGET, time_budget: float = TIME_BUDGET_S,
                 catalogue: list[tuple[str, str]] | None = None, limits: tuple[tuple[int, int], ...] = _AGENT_LIMITS,
                 schema_trusted: bool = True):
        """`catalogue`: the connection's schema as `compile_check.catalogue` reads it, when the caller knows it
        already (a copy of a prepared database); it is read from the connection when first needed otherwise.
        `limits`: SQLite's limits while a query runs (agent SQL's by default; gate's own reads of stored data
        take none, as when it made it: a limit on a value's length refuses reading a longer value).
        `schema_trusted`: whether the schema is gate's own (an episode's); when it is not (a stored database,
        whose views may grow exponentially as SQLite expands them, however short the query that names them),
        every statement is compiled first in the compile check's child."""
        self.conn = conn
        self.guard = False
        self.tables_read: set[str] = set()
        self.steps = 0
        self.end = _UNSET  # where the time budget of the execution under way (or the last) ends (`execute`)
        self.call_wait_limit: float | None = None  # the same, for every run of the tool call under way (`run`)
        self.keep_turn = False  # under a pacer: executions keep the turn they end in (`one_turn`)
        self.next_check = 0  # the step count at which the progress handler next asks the pacer and the clock
        self.compile_over = False
        self.refused = False  # whether the authorizer refused something in the last execution
        self.budget_over = False  # whether the progress handler stopped it for its budget
        self._compiled: str | None = None  # the last query text the compile check passed
        self.compile_seconds = 0.0  # what compiling that text took in the check
        self.compile_refused = False  # whether the check said at once that the last query does not compile
        self._catalogue = catalogue  # the schema as the compile check is given it (None: read it when needed)
        self.step_budget, self.time_budget = step_budget, time_budget
        self.limits = limits
        self.schema_trusted = schema_trusted
        self.interval = INTERVAL
        self._defaults = tuple((lid, conn.getlimit(lid)) for lid, _ in LIMITS.values())  # restored after agent SQL
        conn.set_authorizer(self._authorize)
        conn.set_progress_handler(self._progress, INTERVAL)

    def _authorize(self, action, arg1, arg2, db, _trigger):
        try:
            if not self.guard:  # gate's own SQL: a statement that may change the schema drops the catalogue read
                if action not in _KEEPS_SCHEMA:
                    self._catalogue = None
                return _OK
            if self.end.left() < 0:  # still compiling when the budget ran out
                self.compile_over = True
                return _DENY
            if action == _READ:  # the most frequent: one per column read
                table = str(arg1).lower()
                if table in self.denied_tables or (self.deny_temp and db == "temp"):
                    self.refused = True
                    return _DENY
                self.tables_read.add(table)
                return _OK
            if action not in ALLOWED_ACTIONS or (action == _FUNCTION and str(arg2).lower() in self.denied):
                self.refused = True
                return _DENY
            return _OK
        except BaseException as exc:  # a signal's exception (Ctrl-C) raised here: SQLite would swallow it. Kept,
            _keep(exc)  # to be raised again; agent SQL stops, gate's own statement goes on
            self._catalogue = None
            return _DENY if self.guard else _OK

    def _progress(self):
        try:
            if not self.guard:
                return 0
            steps = self.steps = self.steps + self.interval
            late = False
            if steps >= self.next_check:  # a run counted finely (v2's look check) is called every few steps: its
                self.next_check = steps + INTERVAL  # pacer and clock are asked every INTERVAL steps, as any run's
                pacer = getattr(_PACING, "pacer", None)
                if pacer is not None:
                    pacer.wait(self.end.cap)
                late = self.end.left() < 0
            if late or steps > self.step_budget:
                self.budget_over = True
                return 1
            return 0
        except BaseException as exc:  # as in _authorize
            _keep(exc)
            return 1 if self.guard else 0

    def execute(self, query: str, interval: int = INTERVAL) -> tuple[list[tuple], list[str], int]:
        """(up to MAX_ROWS + 1 rows, column names, steps) of one guarded execution; raises CAUGHT."""
        conn = self.conn
        self.steps = self.next_check = 0
        clock = time.monotonic() + self.time_budget
        # a paced query waits for its turn up to `cap` of the clock at most: a tool call's runs share it
        cap = clock + MAX_WAIT_S if self.call_wait_limit is None else self.call_wait_limit
        # the thread's CPU clock only for a paced query, the only kind that reads it: asking for it is a system
        # call (about ten times the monotonic clock's cost), once per execution
        paced = getattr(_PACING, "pacer", None) is not None
        self.end = BudgetEnd(paced, clock, _thread_time() + self.time_budget if paced else 0.0, cap)
        self.compile_over = self.refused = self.budget_over = False
        self.query_error: sqlite3.Error | None = None  # what the query itself raised (not a statement of gate's)
        raise_swallowed()  # what came during gate's own statements before this one
        if (not self.schema_trusted or may_grow(query)) and query != self._compiled:
            check = take()
            try:
                if self._catalogue is None:
                    with gates_own():
                        self._catalogue = catalogue(conn)
                passed = check.compiles_within(conn, query, self.time_budget * COMPILE_SHARE, self.limits,
                                               self._catalogue, cached=self.schema_trusted,
                                               wait_s=MAX_WAIT_S if self.end.paced else None)
                self.compile_seconds = check.seconds
                self.compile_refused = not passed and check.refused
            finally:
                give(check)
            if not passed:
                self.compile_over = True
                raise sqlite3.OperationalError("interrupted")
            self._compiled = query  # the same text again (a suite's second run of it) needs no second check
        elif query != self._compiled:
            self.compile_seconds = 0.0
        raise_swallowed()  # what came while the schema was read
        if interval != INTERVAL:
            conn.set_progress_handler(self._progress, interval)
        self.interval = interval
        for lid, value in self.limits:
            conn.setlimit(lid, value)
        self.guard = True
        try:
            cur = conn.execute(query)
            fetched = cur.fetchmany(MAX_ROWS + 1)
            columns = [d[0] for d in cur.description] if cur.description else []
            cur.close()
        except sqlite3.DatabaseError as exc:
            self.query_error = exc
            raise_swallowed()  # not the query's error: gate's, given back
            if _an_interrupt(str(exc), decided=self.stopped_itself()):
                raise KeyboardInterrupt from None
            if self.compile_over:
                raise sqlite3.OperationalError("interrupted") from None
            raise
        finally:
            self.guard = False
            pacer = getattr(_PACING, "pacer", None)
            if pacer is not None and not self.keep_turn:
                pacer.done()
            for lid, value in self._defaults:
                conn.setlimit(lid, value)
            if interval != INTERVAL:
                conn.set_progress_handler(self._progress, INTERVAL)
                self.interval = INTERVAL
        return fetched, columns, self.steps

    @contextmanager
    def one_turn(self) -> Iterator[None]:
        """Under a pacer, the block's executions keep the turn each ends in rather than give it up, so the next
        goes on in it (until its turn is over and another query waits, as any); the block gives it up as it
        ends. Suite v2's look check runs a read again with a batch emptied: it starts where the read stopped,
        not at the back of the queue."""
        self.keep_turn = True
        try:
            yield
        finally:
            self.keep_turn = False
            pacer = getattr(_PACING, "pacer", None)
            if pacer is not None:
                pacer.done()

    def stopped_itself(self) -> bool:
        """Whether the last execution's error is the sandbox's own doing: a callback of its found a budget run out
        or refused. An exception raised inside its callbacks (Ctrl-C: Python raises KeyboardInterrupt in whatever
        Python code runs next) is swallowed by SQLite, which stops the query with the same errors: a stop no
        callback decided is that, whatever the clock says by then (a Ctrl-C during one long step comes to the
        next callback after the deadline), and `execute` raises it again (the exception itself where the
        callback caught it; KeyboardInterrupt where it came before the callback's first line)."""
        return self.compile_over or self.refused or self.budget_over

    def after_read(self, query: str, tables: list[str], fetched: list[tuple]) -> dict:
        """What a suite records of a successful read beyond its tables (fields of its ledger entry)."""
        return {}

    def run(self, query: str) -> tuple[dict, list[str], dict]:
        self.tables_read = set()
        self.call_wait_limit = time.monotonic() + self.time_budget + MAX_WAIT_S
        try:
            fetched, columns, _ = self.execute(query)
            tables = sorted(self.tables_read)
            extra = self.after_read(query, tables, fetched)
        finally:
            self.call_wait_limit = None
        result = {"columns": columns, "rows": rows_as_json(fetched[:MAX_ROWS]), "truncated": len(fetched) > MAX_ROWS}
        return result, tables, extra
