"""Compiling agent SQL where it can be stopped: a child process that compiles a statement first.

SQLite's progress handler, which stops a query at its budget, does not run while a statement is
being compiled, and `sqlite3_interrupt` does not stop a compilation either. Most statements
compile in microseconds, but some grow exponentially while SQLite expands them: a subquery or CTE
whose columns are repeated inside each other (`SELECT a+a+a+a AS a FROM (SELECT a+a+a+a AS a FROM
...)`), CTEs that each refer to the one before twice. A few hundred characters compile for minutes.

One SELECT grows too: SQLite's constant propagation puts a copy of a column's constant (`a = 1`) into every
other use of the column, and a column made constant so (`b = a+a+a`) is propagated in turn, so a chain of
equalities grows as the product of its copies (300 characters compiled for 38 s in 10 GB).

So a statement that holds a subquery (its text names SELECT or VALUES more than once), is longer than a
short query, or names more than one equality (`=`, `IS`, `IN`) is compiled first in a child process, on an
empty copy of the database's schema
under the same limits, and stopped at its first step (so nothing runs). If it has not compiled
within its share of the query's budget (for a paced query, `gate serve`'s, by the CPU time the child
used, up to the same wait of the clock beyond it as the query's: what else the machine runs, other
clients' checks among it, does not count), the child is killed (and started again for the next
statement) and the query is refused as `interrupted`, as any query stopped at its budget is. A
child that cannot start (the machine out of processes, memory or descriptors) is the machine's
failure (`NoRoom`), never a statement let through unchecked. The child
ends with the process that started it, even in the middle of a statement (a thread of its own watches
its parent), so a worker killed while its child compiles leaves nothing compiling for nobody. A
function the schema copy lacks (a suite's own) is defined there as a stub, so the copy compiles
what the database would; a statement the copy cannot compile fails in the database at the same
point or sooner (the same schema and limits, an authorizer that allows no more).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from .errors import NoRoom
from .files import readable_within

CHILD = r'''
import json, os, sqlite3, sys, time, _thread
PARENT = int(sys.argv[1])
def watch():  # the process that started this one gone (killed, or ended mid-statement): this one goes too,
    while os.getppid() == PARENT:  # not compiling on for nobody (SQLite lets this thread run while it compiles)
        time.sleep(0.25)
    os._exit(1)
_thread.start_new_thread(watch, ())
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a statement that grows past 2 GiB is refused
except (ImportError, ValueError, OSError):
    pass
ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
conn, schema, faithful = None, None, True
def authorize(action, *_):
    return sqlite3.SQLITE_OK if action in ALLOWED else sqlite3.SQLITE_DENY
def stubbed(run):
    """run(), a function only the database defines made a stub here each time SQLite names one it lacks."""
    for _ in range(20):
        try:
            return run()
        except sqlite3.Error as exc:
            text = str(exc)
            if not text.startswith("no such function: "):
                raise
            conn.create_function(text[len("no such function: "):], -1, lambda *a: None)
    return run()
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("schema") is not None and msg["schema"] != schema:
        schema, faithful = msg["schema"], True
        conn = sqlite3.connect(":memory:")
        for ddl in schema:  # a schema the copy cannot rebuild (a stored one naming an object sqlite_*) is no
            try:  # copy: what it lacks could be what grows, so no statement is said to compile on it
                stubbed(lambda: conn.execute(ddl))
            except (sqlite3.Error, ValueError, OverflowError, MemoryError):
                faithful = False
        for limit, value in msg["limits"]:
            conn.setlimit(limit, value)
        conn.set_authorizer(authorize)
        conn.set_progress_handler(lambda: 1, 1)  # compiled: stopped at its first step, before it runs
    answer = "1" if faithful else "0"
    try:
        if faithful:
            stubbed(lambda: conn.execute(msg["sql"]).fetchone())
    except MemoryError:
        answer = "0"
    except (ValueError, OverflowError):  # text SQLite is never given (a NUL, a lone surrogate): the
        answer = "2"  # database refuses it the same way, at once
    except sqlite3.Error as exc:
        if "out of memory" in str(exc):
            answer = "0"
        elif str(exc) != "interrupted":  # not compiled (no such table, bad syntax): it fails as fast in the
            answer = "2"  # database, but the same text may name what another database holds: not remembered
    sys.stdout.write(answer + "\n")
    sys.stdout.flush()
'''


SHORT = 300  # characters: a statement this short, one SELECT with one equality at most, compiles in a fraction of a second
CPU_POLL_S = 0.02  # how often a check timed by the child's CPU time reads it while it waits
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time process `pid` has used (user and system), or None where it cannot be read (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the name, which may hold spaces and ')'
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime, fields 14 and 15
    except (OSError, IndexError, ValueError):
        return None


# the words that can make an equality SQLite propagates a constant through, besides `=`: `IS` (not `IS [NOT] NULL`)
# and `IN` (`x IN (y)` is `x = y`), in lowered text
_IS_OR_IN = re.compile(r"\bin\b|\bis\b(?!\s+(?:not\s+)?null\b)", re.ASCII)


def _equalities(low: str) -> int:
    """How many equalities lowered statement text may hold: its `=` (not in `>=`, `<=` or `!=`), `IS` and `IN`,
    wherever they stand (in a literal too: counting one too many only sends a statement to be checked)."""
    count = low.count("=")
    if count:
        count -= low.count(">=") + low.count("<=") + low.count("!=")
    return count + len(_IS_OR_IN.findall(low))


def may_grow(query: str) -> bool:
    """Whether the statement could take long to compile: it holds more than one SELECT or VALUES (a
    subquery, a CTE); it is long (one SELECT's column aliases are copied into its WHERE clause, and
    the planner copies terms for each branch of an OR: a product of the text's parts); or it names more
    than one equality. SQLite's constant propagation copies the constant of a `column = constant` term
    into every other use of the column, and a term whose other side became constant so is propagated in
    turn: one equality copies one part of the text into the uses other parts name (with aliases, a product of
    four parts at most: an outside reviewer's best, 0.19 s at 297 characters), a chain of them a product of as
    many parts as it has links, however short the text."""
    if len(query) > SHORT:
        return True
    low = query.lower()
    return low.count("select") + low.count("values") > 1 or _equalities(low) > 1


def catalogue(conn) -> list[tuple[str, str]]:
    """(name, the statement that rebuilds it) of every table, view and index, main then temporary, in
    creation order."""
    main = list(conn.execute("SELECT name, sql FROM main.sqlite_master WHERE sql IS NOT NULL"))
    temp = [(name, sql.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
            for name, sql in conn.execute("SELECT name, sql FROM temp.sqlite_master WHERE sql IS NOT NULL")]
    return main + temp


class _Renaming:
    """A schema's names, each replaced by its place in the schema (a character SQL text cannot hold, then
    the number), in text kept as it is, case and all (two texts that differ only in case may compile apart:
    SQLite ignores only ASCII case, and only in names and keywords, not in a literal, where `'A'` and `'a'`
    can make one window or two): a statement and the schema it is compiled on, renamed so, are the same for
    every database built the same way whatever its tables are called, and compile the same. A name spelt in
    another case than the schema's is left as it is (the statement is then a text of its own). Longest names
    first, so each place stands for one name and the renamed text for one text."""

    def __init__(self, entries: list[tuple[str, str]]):
        places: dict[str, str] = {}
        for k, (name, _) in enumerate(entries):
            places.setdefault(name, f"\x00{k}\x00")
        self.places = sorted(places.items(), key=lambda item: len(item[0]), reverse=True)
        self.schema = tuple(self.rename(sql) for _, sql in entries)
        # a schema whose text holds the character the places are made of cannot be renamed faithfully
        self.faithful = not any("\x00" in name or "\x00" in sql for name, sql in entries)

    def rename(self, text: str) -> str:
        for name, place in self.places:
            text = text.replace(name, place)
        return text


class CompileCheck:
    """`compiles_within(conn, query, seconds)`: False when the query did not compile in time in the child."""

    CACHE = 4096  # statements remembered as compiling in time (then forgotten all at once)

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.seconds = 0.0  # what the last check took (for a remembered statement: what its check took)
        self.failed = False  # whether the last statement failed to compile in the child at once (an error of its text,
        # no such table, say): it fails as fast in the database, so it passes, but it is not remembered, since the same
        # text may compile on a database of the same schema under other names (a table named in another case there)
        self.refused = False  # whether the child said the last statement does not compile in time (rather than
        # taking too long to say): its schema could not be rebuilt there, or compiling it ran out of memory
        self._child: subprocess.Popen | None = None
        self._schema: list[str] | None = None
        self._renaming: tuple[list[tuple[str, str]], _Renaming] | None = None
        self._passed: dict[tuple, float] = {}  # renamed statement, schema, limits -> its check's seconds
        self._cpu_used: float | None = None  # the CPU time the child took to answer the last check, when timed so

    def _start(self) -> subprocess.Popen:
        self._child = subprocess.Popen([sys.executable, "-I", "-S", "-c", CHILD, str(os.getpid())], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        self._schema = None
        return self._child

    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def start(self) -> bool:
        """Start the child now if none runs (it gets ready while the caller goes on); False if none can."""
        try:
            if not self.running():
                self._start()
            return True
        except OSError:
            return False

    def compiles_within(self, conn, query: str, seconds: float, limits=(),
                        entries: list[tuple[str, str]] | None = None, cached: bool = True,
                        wait_s: float | None = None) -> bool:
        """`limits`: (SQLite limit id, value) pairs the database compiles the statement under; `entries`, the
        connection's `catalogue` when the caller knows it as it stands. A statement that compiled in time once
        is not sent again for a database of the same schema but for its names (the next episode's): what it is
        renamed to (`_Renaming`) is the cache's key. `cached=False`: neither looked up nor kept (a schema gate did
        not build, whose renaming takes time that grows with the square of its names, outside any budget).
        `wait_s`: the check is timed by the CPU time the child uses (a paced query's, in `gate serve`: what
        else the machine runs does not count), and waits `seconds` and `wait_s` of the clock at most; None: by
        the clock (and so where the child's CPU time cannot be read). `seconds` is then what it took by that
        measure."""
        start = time.monotonic()
        if entries is None:
            entries = catalogue(conn)
        key = self._key(entries, query, limits) if cached else None
        if key is not None and key in self._passed:
            self.seconds = self._passed[key]
            return True
        self._cpu_used = None
        try:
            passed = self._compiles_within([sql for _, sql in entries], query, seconds, limits, wait_s)
        finally:
            self.seconds = time.monotonic() - start if self._cpu_used is None else self._cpu_used
        if passed and key is not None and not self.failed:
            if len(self._passed) >= self.CACHE:
                self._passed.clear()
            self._passed[key] = self.seconds
        return passed

    def _key(self, entries: list[tuple[str, str]], query: str, limits) -> tuple | None:
        if self._renaming is None or (self._renaming[0] is not entries and self._renaming[0] != entries):
            self._renaming = (entries, _Renaming(entries))
        renaming = self._renaming[1]
        if "\x00" in query or not renaming.faithful:
            return None
        return renaming.rename(query), renaming.schema, tuple(map(tuple, limits))

    def _answered_within(self, child: subprocess.Popen, seconds: float, wait_s: float | None,
                         cpu0: float | None) -> bool:
        """Whether the child answered within `seconds` (see `compiles_within`'s `wait_s`; `cpu0`: the CPU time
        it had used before it was sent the statement)."""
        assert child.stdout is not None
        fd = child.stdout.fileno()
        if wait_s is None or cpu0 is None:
            return readable_within(fd, seconds)
        cap = time.monotonic() + seconds + wait_s
        while True:
            if readable_within(fd, min(CPU_POLL_S, max(0.0, cap - time.monotonic()))):
                used = _cpu_seconds(child.pid)
                self._cpu_used = None if used is None else used - cpu0
                return self._cpu_used is None or self._cpu_used <= seconds  # (answered, but past its share)
            used = _cpu_seconds(child.pid)
            if used is None or used - cpu0 > seconds or time.monotonic() >= cap:
                return False

    def _compiles_within(self, schema: list[str], query: str, seconds: float, limits,
                         wait_s: float | None = None) -> bool:
        try:
            child = self._child if self._child is not None and self._child.poll() is None else self._start()
        except OSError as exc:  # unchecked, the statement could compile for minutes: the machine fails the episode
            raise NoRoom(f"could not start the process that compiles a statement first ({exc.strerror or exc}): "
                         "the machine is out of processes, memory or file descriptors") from None
        self.refused = self.failed = False
        msg = {"sql": query, "schema": schema if schema != self._schema else None, "limits": list(limits)}
        self._schema = schema
        assert child.stdin is not None and child.stdout is not None
        try:
            cpu0 = None if wait_s is None else _cpu_seconds(child.pid)
            child.stdin.write((json.dumps(msg) + "\n").encode())
            ready = self._answered_within(child, seconds, wait_s, cpu0)
            answer = os.read(child.stdout.fileno(), 2) if ready else b""
            if answer in (b"1\n", b"2\n"):
                self.failed = answer == b"2\n"
                return True
            self.refused = answer == b"0\n"
        except OSError:
            pass
        except BaseException:  # interrupted (a signal's exception) with the answer perhaps still to come: the
            self.close()  # child goes with it, so no later statement reads this one's answer as its own
            raise
        self.close()
        return False

    def close(self) -> None:
        if self._child is not None and self.pid == os.getpid():  # a forked process leaves its parent's child be
            self._child.kill()
            self._child.wait()
            for stream in (self._child.stdin, self._child.stdout):
                if stream is not None:
                    stream.close()
            self._child = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_IDLE: list[CompileCheck] = []  # this process's checks that no thread is using, each with its child (or none yet)
_IDLE_LOCK = threading.Lock()
_FORKED_FROM: list[CompileCheck] = []  # in a forked process: its parent's checks, kept (not closed: not its children)


def _forked() -> None:
    """In a forked child: a lock of its own (another thread of the parent may have held the parent's as it forked,
    and would never give it back here), and no check of the parent's to take."""
    global _IDLE_LOCK
    _IDLE_LOCK = threading.Lock()
    _FORKED_FROM.extend(_IDLE)
    _IDLE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def close_all() -> None:
    """Stop this process's idle checks' children and wait for them (a process about to end with `os._exit`, which
    runs no finalizer, leaves no child to be reaped by whoever inherits it). gate's forked workers call it; a process
    forked by something else (multiprocessing, a Celery pool) that plays cases and ends with `os._exit` leaves its
    child to whoever inherits it: the child sees its parent gone and ends within a quarter of a second, and stays
    a zombie only under an init that does not reap."""
    with _IDLE_LOCK:
        for check in _IDLE:
            check.close()


def take() -> CompileCheck:
    """A compile check no other thread is using, for one statement: an idle one of this process (its child
    already started), or a new one; `give` it back afterwards. So a process has as many children as it ever
    compiled statements at once, whichever threads do it (a thread that ends leaves its child to the next);
    a forked process starts its own."""
    pid = os.getpid()
    with _IDLE_LOCK:
        while _IDLE:
            check = _IDLE.pop()
            if check.pid == pid:
                return check
    return CompileCheck()


def give(check: CompileCheck) -> None:
    with _IDLE_LOCK:
        _IDLE.append(check)


@contextmanager
def borrowed() -> Iterator[CompileCheck]:
    """`take` a compile check for the block, and `give` it back after."""
    check = take()
    try:
        yield check
    finally:
        give(check)


def warm(count: int) -> None:
    """Start children until this process has `count` idle checks with one running, without waiting for them
    (a server about to compile statements on `count` threads at once: nobody's first statement waits
    for a child to start)."""
    with _IDLE_LOCK:
        idle = [c for c in _IDLE if c.pid == os.getpid()]
        _IDLE[:] = idle
        ready = sum(c.running() for c in idle)
        for check in idle:
            if ready >= count:
                break
            if not check.running() and check.start():
                ready += 1
        while ready < count:
            check = CompileCheck()
            if not check.start():
                break
            _IDLE.append(check)
            ready += 1
