"""`run_sql` in a v2 episode: the classic sandbox, budgets that grow with the database, a clock fixed
at the night's load, and a record of which batches a read really looked at.

Everything the classic sandbox refuses is refused here, with the same texts (`sandbox.py`). v2
also refuses what would let a query's result change without its rows changing: `random()`,
`changes()`, `total_changes()`, `last_insert_rowid()` and gate's own SQL functions, and reads of
SQLite's internal tables (`dbstat`, `sqlite_dbpage`, `sqlite_stmt`, the temporary schema);
table-valued `pragma_*` functions are refused as any pragma is. `VACUUM` is refused before SQLite sees it,
as `not authorized` (SQLite asks no authorizer about it: it would answer one way on the database an episode
borrows, inside a transaction, and another on a database of the episode's own). 'now' (in `date('now')`,
`julianday()`, `CURRENT_TIMESTAMP`...) is the night's load time (`world.clock_functions`), the same
on every run. The step and time budgets grow with the rows in the database (2,000,000 steps plus
100 per row; 2.0 s plus 10 microseconds per row), so the same checks run on a 200,000-row night as
on a 20-row one.

**Looked at.** A read counts as looking at a batch when SQLite read the batch's rows to answer it:
run again with the batch's staging table emptied (its rows deleted inside a savepoint and put back
by rolling it back: the schema, `sqlite_master` and every other table stay exactly as they were),
it returns other rows, fails, or executes a different number of SQLite virtual-machine steps, by
at least a quarter of the batch's rows (so a check that scans every row and finds nothing counts,
and `WHERE 0`, `LIMIT 0`, `rowid < 0`, a read of the schema, of another table or of the clock do
not). Nothing else can change between the two runs:
the clock is fixed, randomness and change counters are refused, and the emptied table is the only
thing that differs. Steps are counted by the progress handler every `interval` steps (at most a
quarter of the smallest batch's rows, at most 1,000), on the agent's run and on the re-run alike.

The re-run costs at most what is left of the query's own budget (a re-run that would exceed it
decides nothing: the batch is not looked at by that read), so `run_sql` returns within its budget
whatever the query names (under `gate serve`'s pacer, its CPU budget: the re-runs wait for their turns
apart from the read, MAX_WAIT_S of the clock at most). Only staging tables the query read (the authorizer says which) and that
no earlier read looked at are tested, and a batch once looked at is never tested again.
"""
from __future__ import annotations

import re
import sqlite3
import time
from contextlib import contextmanager
from typing import Iterator

from ...kernel import sandbox as kernel_sandbox
from ...kernel.sandbox import (
    CAUGHT,
    DENIED_FUNCTIONS,
    INTERVAL,
    STEP_BUDGET,
    TIME_BUDGET_S,
    BudgetEnd,
    Sandbox,
    gates_own,
    own_statement,
)
from ...kernel.world import no_room, raise_no_room

STEPS_PER_ROW = 100
SECONDS_PER_ROW = 10e-6
GATE_FUNCTIONS = frozenset({"gate_amount"})
STATE_FUNCTIONS = frozenset({"random", "changes", "total_changes", "last_insert_rowid"})
DENIED_FUNCTIONS_V2 = DENIED_FUNCTIONS | STATE_FUNCTIONS | GATE_FUNCTIONS
# tables a read may not name: SQLite's views of its own pages, statements and temporary schema, and gate's
# temporary table of held keys (a DELETE inside a savepoint changes what dbstat shows, not what they hold)
INTERNAL_TABLES = frozenset({"dbstat", "sqlite_dbpage", "sqlite_stmt", "sqlite_temp_master", "sqlite_temp_schema",
                             "gate_held"})


SCHEMA_NOW = "SELECT 1 FROM main.sqlite_master, temp.sqlite_master WHERE 0"
# VACUUM as SQLite reads it: white space (U+FEFF, the byte-order mark, too), comments and empty statements (";")
# first, the keyword in any ASCII case, then no more of a word
_VACUUM = re.compile(r"(?:[ \t\n\f\r;\ufeff]|--[^\n]*(?:\n|\Z)|/\*.*?(?:\*/|\Z))*[vV][aA][cC][uU][uU][mM](?![0-9A-Za-z_$\x80-\ufefe\uff00-\U0010ffff])",
                     re.DOTALL)


def budgets(total_rows: int) -> tuple[int, float]:
    """(step budget, time budget in seconds) of a database holding `total_rows` rows."""
    return STEP_BUDGET + STEPS_PER_ROW * total_rows, TIME_BUDGET_S + SECONDS_PER_ROW * total_rows


# the opcodes of a statement that makes temporary b-trees or sort files of its own (a sort, DISTINCT, a subquery or
# CTE made once, an automatic index): only such a read can need room the database's own pages do not
TEMP_OPCODES = frozenset({"SorterOpen", "OpenEphemeral", "OpenAutoindex", "OpenDup"})


class _OverBudget(Exception):
    """The re-run ran out of what was left of the query's budget."""


class SandboxV2(Sandbox):
    """The kernel's sandbox with scaled budgets; each read also says which staging tables it looked at."""

    denied = DENIED_FUNCTIONS_V2
    denied_tables = INTERNAL_TABLES
    deny_temp = True

    def __init__(self, conn: sqlite3.Connection, staging: dict[str, tuple[list[str], int]], total_rows: int,
                 database: str = "the case's database"):
        """`staging`: staging table -> (its columns, its rows); `database`: its name in gate's errors."""
        super().__init__(conn, *budgets(total_rows))
        self.database = database
        self.staging = staging
        self.pending = set(staging)  # staging tables no read has looked at yet
        self.fine = max(1, min(INTERVAL, min((rows for _, rows in staging.values()), default=INTERVAL) // 4))
        self.counted = False  # whether the last execution counted its steps every `fine` steps

    def may_look(self, query: str) -> bool:
        """Whether the query could read a staging table no read has looked at yet: its text names one
        (SQLite resolves a table only by a name the text spells, in any ASCII case, and a read-only
        database has no views or triggers that could name one for it)."""
        if not self.pending:
            return False
        low = query.lower()
        return any(table in low for table in self.pending)

    def execute(self, query: str, interval: int | None = None) -> tuple[list[tuple], list[str], int]:
        """The kernel's guarded execution, its steps counted every `fine` steps when the read may decide a
        look (the look check compares them), else every INTERVAL steps as any read's. Counted finely, the
        schema is read first, unguarded: a statement that has to read it again (after gate's own writes
        changed it) would count the steps of that reading too, and two runs of one query would differ. The
        look check's own runs (`interval` given) need no such read: each follows the agent's run of the same
        text, with at most the look check's own DELETE, compiled unguarded, between them."""
        if _VACUUM.match(query):  # SQLite asks no authorizer about it
            raise sqlite3.DatabaseError("not authorized")
        self.counted = interval is not None or self.may_look(query)
        if not self.counted:
            return super().execute(query)
        if interval is None:
            own_statement(self.conn, SCHEMA_NOW)
        return super().execute(query, self.fine if interval is None else interval)

    def _rerun_empty(self, query: str, table: str, steps_left: int, end: BudgetEnd,
                     cap: float) -> tuple[list[tuple], int] | None:
        """(rows, steps) of `query` with `table` emptied, within what is left of the budget (`end`: the agent's
        run's; paced, waiting for its turns until `cap` at most); None when the query fails without the rows;
        raises _OverBudget."""
        self._own("SAVEPOINT gate_looked_at")
        try:
            self._own(f'DELETE FROM main."{table}"')
            with self._within(steps_left, end.budget_left(), cap):
                if self.time_budget <= 1.5 * self.compile_seconds or steps_left <= 0:  # compiling it again alone
                    raise _OverBudget  # would take what is left (SQLite cannot stop a compilation)
                try:
                    rows, _, steps = self.execute(query, self.fine)
                except CAUGHT as exc:  # the agent's query's own failure (with the table emptied it may sort more)
                    self._machines(exc, query)
                    if self.budget_over or self.compile_over:  # (its budget's stop, by its own clock)
                        raise _OverBudget from None
                    return None
                return rows, steps
        finally:
            # where SQLite rolled it all back itself (a statement found no room), the emptied table went back with
            # it, and so did the episode's loads, which the world puts back (`World.restore`)
            if self.conn.in_transaction:
                try:
                    self._own("ROLLBACK TO gate_looked_at", must=True)
                finally:  # released whatever came
                    self._own("RELEASE gate_looked_at", must=True)

    @contextmanager
    def _within(self, steps: int, seconds: float, cap: float) -> Iterator[None]:
        """The block's executions (the look check's, after a read) take `steps`, `seconds` and, paced, waits
        for turns until `cap`: what is left of the read's budget. The read's own budget is back as it ends."""
        saved = self.step_budget, self.time_budget, self.call_wait_limit
        self.step_budget, self.time_budget, self.call_wait_limit = steps, seconds, cap
        try:
            yield
        finally:
            self.step_budget, self.time_budget, self.call_wait_limit = saved

    def _own(self, sql: str, must: bool = False) -> None:
        """One of the look check's own statements; one that finds no room for the database's pages is the machine's
        failure (NoRoom), never an error of the agent's query."""
        try:
            own_statement(self.conn, sql, must)
        except sqlite3.Error as exc:
            raise_no_room(exc, self.database)
            raise

    def run(self, query: str) -> tuple[dict, list[str], dict]:
        try:
            if self.may_look(query):  # the look check's runs follow it, in its turn (`one_turn`)
                with self.one_turn():
                    return super().run(query)
            return super().run(query)
        except CAUGHT as exc:
            self._machines(exc, query)
            raise

    def _machines(self, exc: BaseException, query: str) -> None:
        """Raise NoRoom when a read failed for want of room it did not ask for: a statement of gate's own around the
        query (reading the schema, the look check's), or a query that makes nothing temporary of its own, which
        writes only the database's pages (the episode's loads, spilled from the cache), so the room it lacked is
        the one the case needs. A read that sorts, or makes any temporary b-tree, can need room of its own without
        end within its budget: that failure stays its query's error (on a disk full for other reasons too)."""
        room = no_room(exc, self.database) if isinstance(exc, sqlite3.Error) else None
        if room is None:
            return
        if exc is not self.query_error:
            raise room from None
        try:  # text the guard let compile and run: compiling it again takes what it took
            with gates_own():
                opcodes = {row[1] for row in self.conn.execute("EXPLAIN " + query)}
        except sqlite3.Error:
            return  # not known: the query's error
        if not opcodes & TEMP_OPCODES:
            raise room from None

    def after_read(self, query: str, tables: list[str], fetched: list[tuple]) -> dict:
        """The staging tables this read looked at for the first time (`looked_at` in its ledger entry)."""
        candidates = [t for t in tables if t in self.pending]
        looked: list[str] = []
        if not candidates:
            return {"looked_at": looked}
        # the runs below are gate's own, after the read, in its turn (`run`): with what is left of its budget, and
        # (paced) one wait for turns of their own, `cap`: the read's waits may have used up the one it had
        cap = time.monotonic() + self.end.budget_left() + kernel_sandbox.MAX_WAIT_S
        if not self.counted:  # never so (`may_look`); were it so, the read is run again within what is left of
            try:  # its budget, its steps counted finely, to decide (as `_rerun_empty`)
                with self._within(self.step_budget - self.steps, self.end.budget_left(), cap):
                    fetched = self.execute(query, self.fine)[0]
            except CAUGHT:
                return {"looked_at": looked}
        steps, end = self.steps, self.end  # the agent's run: its steps, the end of its budget
        spent = steps
        for table in candidates:
            try:
                again = self._rerun_empty(query, table, self.step_budget - spent, end, cap)
            except _OverBudget:
                break  # what is left of the budget cannot decide: no look, and nothing more is tried
            if again is None or again[0] != fetched or abs(again[1] - steps) >= self.work(table):
                looked.append(table)
            if again is not None:
                spent += again[1]
        self.pending.difference_update(looked)
        return {"looked_at": looked}

    def work(self, table: str) -> int:
        """The least difference in steps that counts as having read the table's rows: a quarter of them (a
        seek that touches one row and finds nothing to return, `rowid < 0`, is not a read of the batch)."""
        return max(2 * self.fine, self.staging[table][1] // 4)

    def mark_looked(self, table: str) -> None:
        """A batch looked at another way (profiled): no read needs testing for it any more."""
        self.pending.discard(table)
