"""The read-only SQL sandbox behind `run_sql`: an authorizer, a step and time budget, limits.

One authorizer and one progress handler are installed per connection and switched on only
while agent SQL runs (`guard`), so gate's own loader can still write. While on, only reads
pass; every table SQLite resolves the query against is recorded, on every execution (the
statement cache is off), which is what `inspected` is graded from.

The budgets hold whatever the query: SQLite checks the progress handler between virtual-machine
steps, so a function that does unbounded work inside one step cannot be interrupted; those are
refused (`printf` and its alias `format`: `printf('%.*c', 1000000000, 'x')` fills a billion
characters before the length limit is checked). Query text is limited (MAX_QUERY_CHARS), so
parsing is bounded too; longer text is refused before SQLite sees it.
"""
from __future__ import annotations

import math
import sqlite3
import time

MAX_ROWS = 50
MAX_CELL = 200
MAX_QUERY_CHARS = 10_000
STEP_BUDGET = 2_000_000
TIME_BUDGET_S = 2.0
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
CAUGHT = (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError)


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


def _cell(value):
    if isinstance(value, bytes):
        return "0x" + value[:100].hex()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if isinstance(value, str) and len(value) > MAX_CELL:
        return value[:MAX_CELL] + "...[truncated]"
    return value


class Sandbox:
    """Guards one connection. `run(query)` returns (result, tables_read) or raises a CAUGHT error."""

    __slots__ = ("conn", "guard", "tables_read", "steps", "deadline", "_defaults")

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.guard = False
        self.tables_read: set[str] = set()
        self.steps = 0
        self.deadline = 0.0
        self._defaults = {name: conn.getlimit(lid) for name, (lid, _) in LIMITS.items()}
        conn.set_authorizer(self._authorize)
        conn.set_progress_handler(self._progress, 1000)

    def _authorize(self, action, arg1, arg2, _db, _trigger):
        if not self.guard:
            return sqlite3.SQLITE_OK
        if action not in ALLOWED_ACTIONS:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_READ:
            self.tables_read.add(str(arg1).lower())
        elif action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _progress(self):
        if not self.guard:
            return 0
        self.steps += 1000
        return 1 if self.steps > STEP_BUDGET or time.monotonic() > self.deadline else 0

    def run(self, query: str) -> tuple[dict, list[str]]:
        conn = self.conn
        self.tables_read = set()
        self.steps = 0
        self.deadline = time.monotonic() + TIME_BUDGET_S
        for lid, value in LIMITS.values():
            conn.setlimit(lid, value)
        self.guard = True
        try:
            cur = conn.execute(query)
            fetched = cur.fetchmany(MAX_ROWS + 1)
            columns = [d[0] for d in cur.description] if cur.description else []
            cur.close()
        finally:
            self.guard = False
            for name, (lid, _) in LIMITS.items():
                conn.setlimit(lid, self._defaults[name])
        rows = [[_cell(v) for v in row] for row in fetched[:MAX_ROWS]]
        return ({"columns": columns, "rows": rows, "truncated": len(fetched) > MAX_ROWS},
                sorted(self.tables_read))
