"""`run_sql` in a v2 episode: the classic sandbox, budgets that grow with the database, and a record
of which batches a read really looked at.

Everything the classic sandbox refuses is refused here, with the same texts (`sandbox.py`); v2
also refuses `random()` (a read must give the same result twice, see below) and gate's own
SQL functions. The step and time budgets grow with the rows in the database (2,000,000 steps
plus 100 per row; 2.0 s plus 10 microseconds per row), so the same checks run on a 200,000-row
night as on a 20-row one.

**Looked at.** A read counts as looking at a batch when the batch's rows made a difference to
it: run again with the batch's staging table empty (renamed away inside a savepoint and
replaced by an empty table of the same columns, then rolled back), it returns other rows, or
executes fewer SQLite virtual-machine steps (so a check that scans every row and finds nothing
counts, and `WHERE 0`, `LIMIT 0` or `COUNT(*) ... WHERE 0` do not). Steps are counted by the
progress handler at a granularity of at most a quarter of the batch's rows. Only staging
tables the query read (the authorizer says which) and that no earlier read looked at are
tested, so an honest agent pays for the test once per batch. A query whose result changes by
itself between two runs (the clock: `'now'`) can pass the test without reading rows.
"""
from __future__ import annotations

import math
import sqlite3
import time

from ..sandbox import (CAUGHT, DENIED_FUNCTIONS, LIMITS, MAX_CELL, MAX_ROWS, STEP_BUDGET, TIME_BUDGET_S, Sandbox,
                       _cell)

STEPS_PER_ROW = 100
SECONDS_PER_ROW = 10e-6
COARSE_INTERVAL = 1000  # the classic sandbox's progress interval, used for every query's budget
GATE_FUNCTIONS = frozenset({"gate_amount"})
DENIED_FUNCTIONS_V2 = DENIED_FUNCTIONS | {"random"} | GATE_FUNCTIONS


def budgets(total_rows: int) -> tuple[int, float]:
    """(step budget, time budget in seconds) of a database holding `total_rows` rows."""
    return STEP_BUDGET + STEPS_PER_ROW * total_rows, TIME_BUDGET_S + SECONDS_PER_ROW * total_rows


def _rows_as_json(fetched: list[tuple]) -> list[list]:
    """The rows as the classic sandbox shapes them (`sandbox._cell`), the common cases decided column
    by column in C (text of at most MAX_CELL characters, integers, NULLs) instead of cell by cell."""
    if not fetched:
        return []
    for column in zip(*fetched):
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
    return [[_cell(v) for v in row] for row in fetched]


class SandboxV2(Sandbox):
    """A classic sandbox with scaled budgets; `run` also says which staging tables the read looked at."""

    __slots__ = ("step_budget", "time_budget", "interval", "staging", "pending")

    def __init__(self, conn: sqlite3.Connection, staging: dict[str, tuple[list[str], int]], total_rows: int):
        """`staging`: staging table -> (its columns, its rows)."""
        super().__init__(conn)
        self.step_budget, self.time_budget = budgets(total_rows)
        self.interval = COARSE_INTERVAL
        self.staging = staging
        self.pending = set(staging)  # staging tables no read has looked at yet

    def _authorize(self, action, arg1, arg2, _db, _trigger):
        if not self.guard:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in DENIED_FUNCTIONS_V2:
            return sqlite3.SQLITE_DENY
        return super()._authorize(action, arg1, arg2, _db, _trigger)

    def _progress(self):
        if not self.guard:
            return 0
        self.steps += self.interval
        return 1 if self.steps > self.step_budget or time.monotonic() > self.deadline else 0

    def _execute(self, query: str, interval: int = COARSE_INTERVAL) -> tuple[list[tuple], list[str], int]:
        """(up to MAX_ROWS + 1 rows, column names, steps) of one guarded execution; raises CAUGHT."""
        conn = self.conn
        self.steps = 0
        self.deadline = time.monotonic() + self.time_budget
        if interval != COARSE_INTERVAL:
            conn.set_progress_handler(self._progress, interval)
        self.interval = interval
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
            if interval != COARSE_INTERVAL:
                conn.set_progress_handler(self._progress, COARSE_INTERVAL)
                self.interval = COARSE_INTERVAL
        return fetched, columns, self.steps

    def _looked(self, query: str, table: str, fetched: list[tuple]) -> bool:
        """Whether `query`'s result or work depends on the rows of staging table `table`."""
        columns, rows = self.staging[table]
        interval = max(1, min(COARSE_INTERVAL, rows // 4))
        conn = self.conn
        tables_read = self.tables_read
        conn.execute("SAVEPOINT gate_looked_at")
        try:
            conn.execute(f'ALTER TABLE main."{table}" RENAME TO "{table}__gate_held"')
            conn.execute(f'CREATE TABLE main."{table}" ({", ".join(chr(34) + c + chr(34) + " TEXT" for c in columns)})')
            try:
                empty, _, empty_steps = self._execute(query, interval)
            except CAUGHT:
                return True  # it ran on the rows and fails without them: they made the difference
        finally:
            conn.execute("ROLLBACK TO gate_looked_at")
            conn.execute("RELEASE gate_looked_at")
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # reload the schema now, not mid-query
            self.tables_read = tables_read
        if empty != fetched:
            return True
        try:
            _, _, steps = self._execute(query, interval)
        except CAUGHT:
            return False
        finally:
            self.tables_read = tables_read
        return steps > empty_steps

    def run(self, query: str) -> tuple[dict, list[str], list[str]]:
        """(result, tables read, staging tables looked at for the first time); raises CAUGHT."""
        self.tables_read = set()
        fetched, columns, _ = self._execute(query)
        tables = sorted(self.tables_read)
        looked = [t for t in tables if t in self.pending and self._looked(query, t, fetched)]
        self.pending.difference_update(looked)
        result = {"columns": columns, "rows": _rows_as_json(fetched[:MAX_ROWS]), "truncated": len(fetched) > MAX_ROWS}
        return result, tables, looked

    def mark_looked(self, table: str) -> None:
        """A batch looked at another way (profiled): no read needs testing for it any more."""
        self.pending.discard(table)

