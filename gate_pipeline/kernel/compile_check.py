"""Compiling agent SQL where it can be stopped: a child process that compiles a statement first.

SQLite's progress handler, which stops a query at its budget, does not run while a statement is
being compiled, and `sqlite3_interrupt` does not stop a compilation either. Most statements
compile in microseconds, but some grow exponentially while SQLite expands them: a subquery or CTE
whose columns are repeated inside each other (`SELECT a+a+a+a AS a FROM (SELECT a+a+a+a AS a FROM
...)`), CTEs that each refer to the one before twice. A few hundred characters compile for minutes.

So a statement that holds a subquery (its text names SELECT or VALUES more than once: one SELECT
alone cannot grow) is compiled first in a child process (`EXPLAIN <query>`, which compiles the
whole statement and runs nothing) on an empty copy of the database's schema. If it has not compiled
within its share of the query's budget, the child is killed (and started again for the next
statement) and the query is refused as `interrupted`, as any query stopped at its budget is. A
function the schema copy lacks (a suite's own) is defined there as a stub, so the copy compiles
what the database would.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading

CHILD = r'''
import json, sqlite3, sys
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a statement that grows past 2 GiB is refused
except (ImportError, ValueError, OSError):
    pass
ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
conn, schema = None, None
def authorize(action, *_):
    return sqlite3.SQLITE_OK if action in ALLOWED else sqlite3.SQLITE_DENY
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("schema") is not None and msg["schema"] != schema:
        schema = msg["schema"]
        conn = sqlite3.connect(":memory:")
        for ddl in schema:
            try:
                conn.execute(ddl)
            except sqlite3.Error:
                pass
        conn.set_authorizer(authorize)
    answer = "1"
    for _ in range(20):  # a function only the database defines: a stub here, then compile again
        try:
            conn.execute("EXPLAIN " + msg["sql"]).fetchone()
            break
        except MemoryError:
            answer = "0"
            break
        except sqlite3.Error as exc:
            text = str(exc)
            if "out of memory" in text:
                answer = "0"
            if not text.startswith("no such function: "):
                break
            conn.create_function(text[len("no such function: "):], -1, lambda *a: None)
    sys.stdout.write(answer + "\n")
    sys.stdout.flush()
'''


def may_grow(query: str) -> bool:
    """Whether the statement could take long to compile: it holds more than one SELECT or VALUES."""
    low = query.lower()
    return low.count("select") + low.count("values") > 1


def schema_of(conn) -> list[str]:
    """The statements that rebuild the connection's schema (main and temporary tables, views, indexes)."""
    main = [sql for (sql,) in conn.execute("SELECT sql FROM main.sqlite_master WHERE sql IS NOT NULL")]
    temp = [sql.replace("CREATE TABLE", "CREATE TEMP TABLE", 1)
            for (sql,) in conn.execute("SELECT sql FROM temp.sqlite_master WHERE sql IS NOT NULL")]
    return main + temp


class CompileCheck:
    """`compiles_within(conn, query, seconds)`: False when the query did not compile in time in the child."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._child: subprocess.Popen | None = None
        self._schema: list[str] | None = None

    def _start(self) -> subprocess.Popen:
        self._child = subprocess.Popen([sys.executable, "-I", "-S", "-c", CHILD], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        self._schema = None
        return self._child

    def compiles_within(self, conn, query: str, seconds: float) -> bool:
        try:
            child = self._child if self._child is not None and self._child.poll() is None else self._start()
        except OSError:  # no child can start here: the authorizer's bound on compiling is all there is
            return True
        schema = schema_of(conn)
        msg = {"sql": query, "schema": schema if schema != self._schema else None}
        self._schema = schema
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write((json.dumps(msg) + "\n").encode())
            ready, _, _ = select.select([child.stdout], [], [], max(0.0, seconds))
            if ready and os.read(child.stdout.fileno(), 2) == b"1\n":
                return True
        except OSError:
            pass
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


_LOCAL = threading.local()


def shared() -> CompileCheck:
    """This thread's compile check (one child for every episode the thread plays, started when first needed;
    a forked process starts its own)."""
    check = getattr(_LOCAL, "check", None)
    if check is None or check.pid != os.getpid():
        check = _LOCAL.check = CompileCheck()
    return check
