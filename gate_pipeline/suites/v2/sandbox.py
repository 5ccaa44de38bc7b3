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

import sqlite3

from ...kernel.sandbox import CAUGHT, DENIED_FUNCTIONS, INTERVAL, STEP_BUDGET, TIME_BUDGET_S, Sandbox

STEPS_PER_ROW = 100
SECONDS_PER_ROW = 10e-6
GATE_FUNCTIONS = frozenset({"gate_amount"})
DENIED_FUNCTIONS_V2 = DENIED_FUNCTIONS | {"random"} | GATE_FUNCTIONS


def budgets(total_rows: int) -> tuple[int, float]:
    """(step budget, time budget in seconds) of a database holding `total_rows` rows."""
    return STEP_BUDGET + STEPS_PER_ROW * total_rows, TIME_BUDGET_S + SECONDS_PER_ROW * total_rows


class SandboxV2(Sandbox):
    """The kernel's sandbox with scaled budgets; each read also says which staging tables it looked at."""

    denied = DENIED_FUNCTIONS_V2

    def __init__(self, conn: sqlite3.Connection, staging: dict[str, tuple[list[str], int]], total_rows: int):
        """`staging`: staging table -> (its columns, its rows)."""
        super().__init__(conn, *budgets(total_rows))
        self.staging = staging
        self.pending = set(staging)  # staging tables no read has looked at yet

    def _looked(self, query: str, table: str, fetched: list[tuple]) -> bool:
        """Whether `query`'s result or work depends on the rows of staging table `table`."""
        columns, rows = self.staging[table]
        interval = max(1, min(INTERVAL, rows // 4))
        conn = self.conn
        tables_read = self.tables_read
        conn.execute("SAVEPOINT gate_looked_at")
        try:
            conn.execute(f'ALTER TABLE main."{table}" RENAME TO "{table}__gate_held"')
            conn.execute(f'CREATE TABLE main."{table}" ({", ".join(chr(34) + c + chr(34) + " TEXT" for c in columns)})')
            try:
                empty, _, empty_steps = self.execute(query, interval)
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
            _, _, steps = self.execute(query, interval)
        except CAUGHT:
            return False
        finally:
            self.tables_read = tables_read
        return steps > empty_steps

    def after_read(self, query: str, tables: list[str], fetched: list[tuple]) -> dict:
        """The staging tables this read looked at for the first time (`looked_at` in its ledger entry)."""
        looked = [t for t in tables if t in self.pending and self._looked(query, t, fetched)]
        self.pending.difference_update(looked)
        return {"looked_at": looked}

    def mark_looked(self, table: str) -> None:
        """A batch looked at another way (profiled): no read needs testing for it any more."""
        self.pending.discard(table)
