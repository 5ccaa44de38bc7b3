"""What every suite's episode world shares: the prepared case, the world one episode plays on, the mart.

`PreparedCase` does once per case what every episode of it shares (the listing, the staging
table names, the profiles once asked for, the mart a correct run gives); a suite's subclass
builds the case's database. `World` is one episode's state: its SQLite connection, the sandbox
that guards agent SQL on it, its ledger, the loads and quarantines so far and the report. The
tools (`kernel.episode`) are the only way an agent touches a world; the grader reads its ledger
and its warehouse afterwards.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .cases import Case, staging_table
from .errors import NoRoom
from .ledger import Ledger
from .sandbox import Sandbox
from .suite import MART_SQL, Suite, suites

SPILL_CACHE_KIB = 32768  # a spilling database's page cache: every case of up to a few thousand rows a batch fits


def connect(spill: bool = False) -> sqlite3.Connection:
    """A private SQLite database as every episode uses it (no statement cache: the sandbox's authorizer
    must see every execution; autocommit, so gate opens its own transactions). In memory; or, with
    `spill`, SQLite's temporary database (an empty file name): the same while it fits its page cache
    (SPILL_CACHE_KIB), and beyond that its pages in a file SQLite unlinks as soon as it makes it, so a
    database larger than the machine's memory can be played and the process holds only the cache (the
    operating system's file cache keeps the rest, for as long as it has room)."""
    conn = sqlite3.connect("" if spill else ":memory:", cached_statements=0, isolation_level=None,
                           check_same_thread=False)
    if spill:
        conn.execute(f"PRAGMA cache_size = -{SPILL_CACHE_KIB}")
        conn.execute("PRAGMA journal_mode = MEMORY")  # as an in-memory database's: rolling back reads no file
    return conn


ROOM_HINT = "set SQLITE_TMPDIR to a directory it can write, with room"
_NO_ROOM = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN})


def no_room(exc: sqlite3.Error, what: str) -> NoRoom | None:
    """The user's error for `exc` when SQLite could not write a spilling database's temporary file (a full
    disk, a file-size limit, no temporary directory it may use), else None."""
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _NO_ROOM:
        return None
    return NoRoom(f"{what}: {exc} (SQLite keeps a database's pages beyond its {SPILL_CACHE_KIB // 1024} MiB cache in "
                  f"a temporary file: {ROOM_HINT})")


def raise_no_room(exc: BaseException, what: str) -> None:
    """Raise `no_room`'s NoRoom in place of `exc` (called where `exc` is handled) when it is SQLite finding no
    room for a spilling database's pages; otherwise return, and the caller raises `exc` again."""
    room = no_room(exc, what) if isinstance(exc, sqlite3.Error) else None
    if room is not None:
        raise room from None


_SCRATCH = threading.local()


def scratch() -> sqlite3.Connection:
    """This thread's connection for building databases that are then serialized (a prepared case's image):
    gate's own, never an agent's, so its counters (total_changes() and the like) are nobody's business.
    One per thread and process, kept, so building an image does not open and close a connection each time.
    Its statements are never cached: a statement compiled before `deserialize` could run on the next
    database as if its schema were the old one. Whoever uses it leaves no transaction open."""
    conn = getattr(_SCRATCH, "conn", None)
    if conn is None or _SCRATCH.pid != os.getpid():
        conn = _SCRATCH.conn = connect()
        _SCRATCH.pid = os.getpid()
    return conn


def revenue_of(total) -> float:
    """A revenue mart's total as gate records it: a float rounded to cents."""
    return round(float(total), 2)


def mart_revenue(conn: sqlite3.Connection, sql: str = MART_SQL) -> float:
    """The revenue mart of a warehouse (a suite's `mart_sql`; by default SUM(amount) over orders joined to
    customers), rounded to cents."""
    return revenue_of(conn.execute(sql).fetchone()[0])


@dataclass(frozen=True)
class BatchFindings:
    """What a suite's contract finds in one batch (the Dagster contract check shows it): the rules it
    breaks (objects with `key`, `column` and `defect_type`), and per failing row (rule, row index,
    column, value)."""
    batch_id: str
    table: str
    rows: int
    rules: list = field(default_factory=list)
    failing: list[tuple[Any, int, str, Any]] = field(default_factory=list)


class PreparedCase:
    """Everything an episode of `case` can share; a suite's subclass builds its database.

    Subclasses implement `row_count(batch_id)`, `profile_of(batch_id)`
    (computed once, then copied), `preview`, `correct_mart`, `gold_rows` and, when they keep one,
    `close()` for the prepared database."""

    def __init__(self, case: Case):
        self.case = case
        self.suite: Suite = suites.get(case.suite)
        self.case_id: str = case.case_id
        self.contract: dict = case.contract  # type: ignore[assignment]
        self.batches = {b.batch_id: b for b in case.batches}
        self.order = [b.batch_id for b in case.batches]
        self.staging = {bid: staging_table(bid) for bid in self.order}
        self.truth = {bid: b.truth for bid, b in self.batches.items()}
        self._profiles: dict[str, dict] = {}

    @cached_property
    def contract_json(self) -> str:
        """The contract as `read_contract` answers it (a fresh copy of this each call), made at the first call."""
        return json.dumps(self.contract)

    @cached_property
    def listing(self) -> list[dict]:
        """What `list_batches` answers: id, table, rows, staging table and source of each batch, in order."""
        return [{"batch_id": bid, "table": b.table, "rows": self.row_count(bid), "staging_table": self.staging[bid],
                 "source": b.source} for bid, b in self.batches.items()]

    def row_count(self, batch_id: str) -> int:
        raise NotImplementedError

    def profile_of(self, batch_id: str) -> dict:
        raise NotImplementedError

    def profile(self, batch_id: str) -> dict:
        """A fresh copy of the batch's profile (computed on first use)."""
        if batch_id not in self._profiles:
            self._profiles[batch_id] = self.profile_of(batch_id)
        p = self._profiles[batch_id]
        return {**p, "columns": {c: {**v, "top_values": [list(t) for t in v["top_values"]]}
                                 for c, v in p["columns"].items()}}

    def preview(self, batch_id: str, n: int) -> tuple[list[str], list[list]]:
        """(the batch's columns, its first n rows), for a human's look (the Dagster asset's metadata)."""
        raise NotImplementedError

    def warehouse_rows(self) -> dict[str, int]:
        """Rows per warehouse table before tonight ({"customers": n, "orders": m})."""
        raise NotImplementedError

    @property
    def correct_mart(self) -> float:
        raise NotImplementedError

    @property
    def gold_rows(self) -> list[tuple]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class World:
    """One episode's warehouse and bookkeeping. Agents reach it only through the tools."""

    def __init__(self, prepared: PreparedCase, conn: sqlite3.Connection, sandbox: Sandbox, listener=None,
                 deferred_ledger: bool = False):
        self.prepared = prepared
        self.conn = conn
        self.sandbox = sandbox
        self.ledger = Ledger(listener, deferred_ledger)
        self.loads: dict[str, int] = {}
        self.quarantined: dict[str, dict] = {}  # batch -> its first citation
        self.orphans_at_load: dict[str, int] = {}
        self.report: dict | None = None

    def orphan_rows(self, batch_id: str) -> int:
        """Rows of the batch whose reference is not in the warehouse right now (0 for a batch without one)."""
        raise NotImplementedError

    def rows_to_load(self, batch_id: str) -> int:
        return self.prepared.row_count(batch_id)

    def load(self, batch_id: str) -> int:
        """The loader: inserts the batch's rows, any number of times, and never complains."""
        raise NotImplementedError

    def revenue(self) -> float:
        return mart_revenue(self.conn, self.prepared.suite.mart_sql)

    def restore(self) -> None:
        """Put back what SQLite undid by itself when a statement failed for want of room (a suite whose database
        spills to a file and plays in a transaction); NoRoom when there is no room to."""

    def no_room(self, exc: sqlite3.Error) -> NoRoom | None:
        """gate's error for a statement of its own on this world's database that found no room for the database's
        pages (a suite whose database spills to a file), else None."""
        return None

    def image(self) -> bytes:
        """The final database, as a file's bytes (for a sink that keeps warehouses)."""
        return self.conn.serialize()

    def close(self) -> None:
        self.conn.close()
