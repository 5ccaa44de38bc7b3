"""A v2 episode's world: a warehouse with a past, staged files, the loader that copies by position.

`PreparedCaseV2` does once per case what every episode of it shares. It builds one SQLite
database: the warehouse (`wh_customers`, `wh_orders`, each row with the `batch_id` that loaded
it, and `wh_load_log`), and one staging table per batch with the columns its file's header
names. The case's CSV text streams into SQLite (no Python object per row is kept), profiles
are computed by SQLite when first asked for, and the correct mart is one SQL query.

An episode borrows that database inside a transaction which is rolled back when the episode
ends, so the next episode finds it as built, without a copy of the database per episode; an
episode that opens while another holds it gets a database of its own, built from the case.

The loader (`load_batch`) copies a file's columns into the warehouse **by position**, whatever
the header says (as `INSERT INTO wh_orders SELECT * FROM staging` would): the first column
into the first contract column and so on; extra columns are dropped, missing ones are NULL,
and the amount (third column of an orders file) is read as the classic loader reads it
(`float(text.strip())`, 0.0 for anything else). Rows quarantined with `quarantine_rows` (by
the key column the header names) are held back. It never complains.
"""
from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property

from ...kernel.cases import Case
from ...kernel.errors import NoRoom
from ...kernel.sandbox import own_statement, sql_function
from ...kernel.world import PreparedCase, World, connect, no_room, raise_no_room, revenue_of
from .contract import COLUMNS_V2, KEY_COLUMNS
from .files import header_of, rows_of
from .generator import LOAD_HOUR
from .layout import INDEXES, LOAD_LOG_COLUMNS, WAREHOUSE_COLUMNS, WAREHOUSE_DDL
from .owner import Owner
from .sandbox import SandboxV2


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _insert_sql(table: str, columns, values: str | None = None) -> str:
    return (f"INSERT INTO {table} ({', '.join(_quoted(c) for c in columns)}) "
            f"VALUES ({values or ', '.join('?' * len(columns))})")


def loader_amount(value) -> float:
    """What the loader makes of an amount: a float, and 0.0 for anything it cannot parse (as the classic's)."""
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return 0.0


TIME_FUNCTIONS = ("date", "time", "datetime", "julianday", "unixepoch", "strftime")
NOW_KEYWORDS = {"current_date": "date", "current_time": "time", "current_timestamp": "datetime"}
_CLOCK_QUERIES = {name: [f"SELECT {name}({', '.join('?' * n)})" for n in range(0, 12)] for name in TIME_FUNCTIONS}
_CLOCK = threading.local()  # per thread: the connection whose SQLite functions answer the calls


def _clock() -> sqlite3.Connection:
    """This thread's connection for SQLite's own date and time functions (one per thread, kept)."""
    helper = getattr(_CLOCK, "conn", None)
    if helper is None:
        helper = _CLOCK.conn = sqlite3.connect(":memory:")
    return helper


@functools.lru_cache(maxsize=64)
def _now_values(now: str) -> tuple[tuple[str, str], ...]:
    """(keyword, its value at `now`) of CURRENT_DATE, CURRENT_TIME and CURRENT_TIMESTAMP."""
    return tuple((keyword, _clock().execute(f"SELECT {name}(?)", (now,)).fetchone()[0])
                 for keyword, name in NOW_KEYWORDS.items())


def clock_functions(conn: sqlite3.Connection, now: str) -> None:
    """SQLite's date and time functions on `conn`, with 'now' (and no time value at all, which means now)
    the night's load time `now`: a query gives the same answer on every run. Each call is answered by
    SQLite's own function on a connection of its own (`_clock`), so every other argument means what
    SQLite says."""
    for name, n_args, fn in _clock_set(now):
        conn.create_function(name, n_args, fn, deterministic=True)


@functools.lru_cache(maxsize=64)
def _clock_set(now: str) -> tuple[tuple[str, int, Callable], ...]:
    """(name, argument count, function) of each clock function at `now`, made once per night (they hold
    nothing but `now`, and each call finds its thread's `_clock` connection)."""

    def make(name: str):
        at = 1 if name == "strftime" else 0  # strftime's first argument is its format
        queries = _CLOCK_QUERIES[name]

        def fn(*args):
            values = list(args)
            if len(values) <= at:
                values.append(now)
            elif isinstance(values[at], str) and values[at].strip().lower() == "now":
                values[at] = now
            if len(values) >= len(queries):
                raise ValueError(f"{name}: too many arguments")
            return _clock().execute(queries[len(values)], values).fetchone()[0]
        return fn

    return (*((name, -1, sql_function(make(name))) for name in TIME_FUNCTIONS),
            *((keyword, 0, sql_function(lambda value=value: value)) for keyword, value in _now_values(now)))


_GATE_AMOUNT = sql_function(loader_amount)


def _connection(night: str) -> sqlite3.Connection:
    """A case's database: batches of any size, so its pages beyond SQLite's cache go to a temporary file."""
    conn = connect(spill=True)
    conn.create_function("gate_amount", 1, _GATE_AMOUNT, deterministic=True)
    clock_functions(conn, f"{night} {LOAD_HOUR}")
    return conn


class PreparedCaseV2(PreparedCase):
    """Everything the episodes of a v2 case share. Build once per case, then open many worlds."""

    def __init__(self, case: Case):
        super().__init__(case)
        self.database = f"case {case.case_id}'s database"  # how an error (NoRoom) names it
        self.night: str = case.data["night"]
        self.headers = {bid: header_of(b.data["csv"]) for bid, b in self.batches.items()}
        self.row_counts = {bid: b.data["row_count"] for bid, b in self.batches.items()}
        self.owner = Owner(case.data["owner"], self.contract)
        self._db: sqlite3.Connection | None = None
        self._db_busy = False
        self._correct_mart: float | None = None  # `correct_mart`, once computed
        # the database is lent to one episode at a time, and read by nobody else while it is: an episode's query
        # runs SQLite's callbacks, and a second thread on the same connection meanwhile can deadlock both
        self._lock = threading.RLock()
        self.total_rows = 0
        self._db = self.build()
        self.db_bytes = self.database_bytes(self._db)

    def row_count(self, batch_id: str) -> int:
        return self.row_counts[batch_id]

    # -- the database ---------------------------------------------------------------------
    def build(self) -> sqlite3.Connection:
        """A new database holding the case: the warehouse's past and the staged files."""
        conn = _connection(self.night)
        total = 0
        try:
            conn.execute("BEGIN")
            for ddl in WAREHOUSE_DDL:
                conn.execute(ddl)
            wh = self.case.data["warehouse"]
            for table in ("customers", "orders"):
                cur = conn.executemany(_insert_sql(f"wh_{table}", WAREHOUSE_COLUMNS[table]), rows_of(wh[table]))
                total += max(cur.rowcount, 0)
            cur = conn.executemany(_insert_sql("wh_load_log", LOAD_LOG_COLUMNS, "?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, '')"),
                                   rows_of(wh["load_log"]))
            total += max(cur.rowcount, 0)
            for bid, batch in self.batches.items():
                header, name = self.headers[bid], self.staging[bid]
                conn.execute(f"CREATE TABLE {name} ({', '.join(_quoted(c) + ' TEXT' for c in header)})")
                cur = conn.executemany(_insert_sql(name, header), rows_of(batch.data["csv"]))
                total += max(cur.rowcount, 0)
            for ddl in INDEXES:
                conn.execute(ddl)
            conn.execute("COMMIT")
        except BaseException as exc:
            conn.close()
            raise_no_room(exc, self.database)
            raise
        self.total_rows = total
        return conn

    @staticmethod
    def database_bytes(conn: sqlite3.Connection) -> int:
        return conn.execute("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()").fetchone()[0]

    def open_db(self) -> tuple[sqlite3.Connection, bool]:
        """(connection, borrowed): the prepared database inside a transaction when no episode holds it,
        else a database of the episode's own."""
        with self._lock:
            if not self._db_busy and self._db is not None:
                own_statement(self._db, "BEGIN")  # the last episode's callbacks are still on it: Ctrl-C's, perhaps
                self._db_busy = True
                return self._db, True
        return self.build(), False

    def release_db(self, conn: sqlite3.Connection, borrowed: bool) -> None:
        if borrowed:
            with self._lock:
                try:
                    if conn.in_transaction:  # the episode's loads undone, whatever comes (Ctrl-C)
                        own_statement(conn, "ROLLBACK", must=True)
                    elif conn is self._db:  # SQLite rolled the episode's transaction back itself (a write that found
                        # no room): what it did after that stayed in the database, so no later episode is given it
                        self._db = None
                        conn.close()
                finally:
                    self._db_busy = False
        else:
            conn.close()

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A connection to read the staged files and the past from, for as long as the block runs (staging never
        changes, and the past is told apart from tonight's loads by batch_id): the prepared database when no
        episode holds it, else a copy made for the read (an episode reads through its own connection instead:
        `profile_on`, `correct_mart_on`). The lock is held through the read, which it holds only while no episode
        has the database: an episode that opens meanwhile waits for the read (seconds at most, at real size) rather
        than build a copy of the whole database."""
        with self._lock:
            if not self._db_busy:
                if self._db is None:
                    self._db = self.build()
                yield self._db
                return
        copy = self.build()
        try:
            yield copy
        finally:
            copy.close()

    # -- what the tools and the grader read ------------------------------------------------
    def preview(self, batch_id: str, n: int) -> tuple[list[str], list[list]]:
        """(the file's header, its first n rows), for a human's look (the Dagster asset's metadata)."""
        rows: list[list[str]] = []
        for row in rows_of(self.batches[batch_id].data["csv"]):
            if len(rows) >= n:
                break
            rows.append(row)
        return list(self.headers[batch_id]), rows

    def profile_of(self, batch_id: str) -> dict:
        with self.reading() as conn:
            return self._profile(conn, batch_id)

    def profile_on(self, batch_id: str, conn: sqlite3.Connection) -> None:
        """Compute the batch's profile through an episode's own connection, when it is not known yet."""
        if batch_id not in self._profiles:
            self._profiles[batch_id] = self._profile(conn, batch_id)

    def _profile(self, conn: sqlite3.Connection, batch_id: str) -> dict:
        return profile(conn, self.batches[batch_id], self.staging[batch_id], self.headers[batch_id],
                       self.row_counts[batch_id])

    def warehouse_rows(self) -> dict[str, int]:
        return {t: sum(1 for _ in rows_of(self.case.data["warehouse"][t])) for t in ("customers", "orders")}

    @property
    def correct_mart(self) -> float:
        """The mart if every batch were handled as its truth says: the warehouse's past, every clean batch
        loaded once, every row-level batch loaded without its bad rows, by the loader's rules (computed once)."""
        if self._correct_mart is None:
            with self.reading() as conn:
                return self.correct_mart_on(conn)
        return self._correct_mart

    def correct_mart_on(self, conn: sqlite3.Connection) -> float:
        """`correct_mart`, computed through an episode's own connection when it is not known yet."""
        if self._correct_mart is None:
            self._correct_mart = correct_mart(conn, self)
        return self._correct_mart

    @cached_property
    def gold_rows(self) -> list[tuple]:
        from .gold import gold_rows  # pandas + pandera: only when the dense reward is used
        return gold_rows(self.case, self)

    def close(self) -> None:
        if self._db is not None and not self._db_busy:
            self._db.close()
            self._db = None


BLANK_CHARS = " \t\r\n"
DECIMAL_SQL = ("({c} NOT GLOB '*[^0-9.-]*' AND ({c} GLOB '[0-9]*' OR {c} GLOB '-[0-9]*') AND {c} GLOB '*[0-9]' "
               "AND instr(substr({c}, 2), '-') = 0 AND length({c}) - length(replace({c}, '.', '')) <= 1)")


def decimal_sql(column: str) -> str:
    """A SQL test that `column` is a plain decimal number: -?[0-9]+(\\.[0-9]+)? (the contract's amount form)."""
    return DECIMAL_SQL.format(c=column)


def profile(conn: sqlite3.Connection, batch, staging: str, header: list[str], rows: int) -> dict:
    """A batch's profile, computed by SQLite: per column n_null, n_blank, n_distinct, min and max (as
    text), numeric_min and numeric_max (over values that are plain decimal numbers), top_values (up to
    8 [value, count], most frequent first, then by value)."""
    columns = {}
    for c in header:
        q = _quoted(c)
        n_null, n_blank, n_distinct, lo, hi, nlo, nhi = conn.execute(
            f"SELECT SUM({q} IS NULL), SUM(trim({q}, ?) = ''), COUNT(DISTINCT {q}) + (SUM({q} IS NULL) > 0), "
            f"MIN({q}), MAX({q}), MIN(CASE WHEN {decimal_sql(q)} THEN CAST({q} AS REAL) END), "
            f"MAX(CASE WHEN {decimal_sql(q)} THEN CAST({q} AS REAL) END) FROM {staging}", (BLANK_CHARS,)).fetchone()
        top = conn.execute(f"SELECT {q}, COUNT(*) FROM {staging} GROUP BY {q} ORDER BY 2 DESC, 1 LIMIT 8").fetchall()
        columns[c] = {"n_null": n_null or 0, "n_blank": n_blank or 0, "n_distinct": n_distinct or 0,
                      "min": lo, "max": hi, "numeric_min": nlo, "numeric_max": nhi,
                      "top_values": [[v, n] for v, n in top]}
    return {"batch_id": batch.batch_id, "table": batch.table, "rows": rows, "columns": columns}


def load_exprs(prepared, batch_id: str) -> list[str]:
    """The SQL expressions that turn a staged file's row into the warehouse columns, by position."""
    table = prepared.batches[batch_id].table
    header = prepared.headers[batch_id]
    exprs = []
    for i, column in enumerate(COLUMNS_V2[table]):
        if i >= len(header):
            exprs.append("NULL")
        elif table == "orders" and column == "amount":
            exprs.append(f"gate_amount({_quoted(header[i])})")
        else:
            exprs.append(_quoted(header[i]))
    return exprs


def correct_mart(conn: sqlite3.Connection, prepared) -> float:
    """The correct mart, by SQLite: the past (rows no batch of tonight loaded) and what the loader makes of
    every batch the truth loads, without the rows it quarantines, joined as the mart joins."""
    tonight = list(prepared.order)
    marks = ", ".join("?" * len(tonight))
    customers = [f"SELECT customer_id FROM wh_customers WHERE batch_id IS NULL OR batch_id NOT IN ({marks})"]
    orders = [f"SELECT customer_id, amount FROM wh_orders WHERE batch_id IS NULL OR batch_id NOT IN ({marks})"]
    params_c, params_o = list(tonight), list(tonight)
    for bid in prepared.order:
        truth = prepared.truth[bid]
        if truth["disposition"] == "quarantine":
            continue
        table = prepared.batches[bid].table
        exprs = load_exprs(prepared, bid)
        bad = sorted({k for d in truth["defects"] for k in d.get("keys", ())})
        where = f" WHERE {_quoted(KEY_COLUMNS[table])} NOT IN ({', '.join('?' * len(bad))})" if bad else ""
        if table == "customers":
            customers.append(f"SELECT {exprs[0]} FROM {prepared.staging[bid]}{where}")
            params_c += bad
        else:
            orders.append(f"SELECT {exprs[1]}, {exprs[2]} FROM {prepared.staging[bid]}{where}")
            params_o += bad
    query = (f"WITH c(customer_id) AS ({' UNION ALL '.join(customers)}), "
             f"o(customer_id, amount) AS ({' UNION ALL '.join(orders)}) "
             "SELECT COALESCE(SUM(o.amount), 0) FROM o JOIN c ON o.customer_id = c.customer_id")
    return revenue_of(conn.execute(query, params_c + params_o).fetchone()[0])


class WorldV2(World):
    """One v2 episode's warehouse and bookkeeping. Agents reach it only through `suites.v2.tools`."""

    def __init__(self, prepared: PreparedCaseV2, listener=None, deferred_ledger: bool = False):
        conn, self._borrowed = prepared.open_db()
        staging = {prepared.staging[bid]: (prepared.headers[bid], prepared.row_counts[bid]) for bid in prepared.order}
        sandbox = SandboxV2(conn, staging, prepared.total_rows, prepared.database)
        super().__init__(prepared, conn, sandbox, listener, deferred_ledger)
        self.prepared: PreparedCaseV2 = prepared
        self.sandbox: SandboxV2
        self.citations: dict[str, list[tuple[str, str]]] = {}
        self.held: dict[str, set[str]] = {}           # batch -> keys of the rows quarantined
        self.held_rows: dict[str, int] = {}           # batch -> rows those keys matched
        self.applied: list[str] = []                 # the loads made, in their order (`restore`)
        self.restored = 0                             # how many times `restore` made them again
        self._closed = False

    def _held_filter(self, batch_id: str) -> str:
        """The WHERE clause that holds a batch's quarantined rows back (the keys in a temporary table)."""
        keys = self.held.get(batch_id)
        if not keys:
            return ""
        table = self.prepared.batches[batch_id].table
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS gate_held (k TEXT PRIMARY KEY)")
        self.conn.execute("DELETE FROM temp.gate_held")
        self.conn.executemany("INSERT INTO temp.gate_held VALUES (?)", ((k,) for k in keys))
        return f" WHERE {_quoted(KEY_COLUMNS[table])} NOT IN (SELECT k FROM temp.gate_held)"

    def orphan_rows(self, batch_id: str) -> int:
        """Rows of an orders batch, held rows aside, whose customer (the file's second column, where the
        loader puts customer_id) is not in wh_customers right now."""
        prepared = self.prepared
        # a load is coming (a load's entry counts its orphans first): the grade's correct mart is computed before
        # it, so the temporary tables of its query never come on top of the loads and their rollback journal
        prepared.correct_mart_on(self.conn)
        if prepared.batches[batch_id].table != "orders":
            return 0
        header = prepared.headers[batch_id]
        where = self._held_filter(batch_id)
        customer = _quoted(header[1]) if len(header) > 1 else "NULL"
        cond = (f"NOT EXISTS (SELECT 1 FROM wh_customers c WHERE c.customer_id = s.{customer})"
                if customer != "NULL" else "1")
        sql = f"SELECT COUNT(*) FROM {prepared.staging[batch_id]} s"
        sql += f"{where} AND {cond}" if where else f" WHERE {cond}"
        return self.conn.execute(sql).fetchone()[0]

    def rows_to_load(self, batch_id: str) -> int:
        return self.prepared.row_counts[batch_id] - self.held_rows.get(batch_id, 0)

    def restore(self) -> None:
        """Put the episode's loads back where SQLite undid them. An episode on the borrowed database plays inside
        its transaction, and SQLite rolls that back by itself when a statement fails for want of room: a write of
        its temporary file, or an agent's read whose sort spilled to one. The loads are made again, in their order,
        in a new transaction (the loader is deterministic: the same rows, the same pages), so an agent's failed read
        costs it only that read; where they find no room themselves, that is the machine's failure (NoRoom)."""
        if not self._borrowed or self.conn.in_transaction:
            return
        conn = self.conn
        try:
            own_statement(conn, "BEGIN")
            for batch_id in self.applied:
                self._insert(batch_id)
        except BaseException as exc:
            if conn.in_transaction:  # nothing half made: the next restore makes them all
                own_statement(conn, "ROLLBACK", must=True)
            raise_no_room(exc, self.prepared.database)
            raise
        self.restored += 1

    def revenue(self) -> float:
        self.restore()
        self.prepared.correct_mart_on(self.conn)  # the grade reads it next: through this episode's connection
        return super().revenue()

    def no_room(self, exc: sqlite3.Error) -> NoRoom | None:
        return no_room(exc, self.prepared.database)

    def image(self) -> bytes:
        """The final database as a file's bytes, the same however it was kept: an in-memory database leaves the
        header's change counter (bytes 24-27), its copy (92-95) and SQLite's version (96-99) at zero, and a
        database whose pages went to a file does not."""
        image = bytearray(super().image())
        image[24:28] = bytes(4)
        image[92:100] = bytes(8)
        return bytes(image)

    def load(self, batch_id: str) -> int:
        """The loader: copies the file's rows (held rows aside) into the warehouse by position."""
        self.restore()
        rows = self._insert(batch_id)
        self.applied.append(batch_id)
        return rows

    def _insert(self, batch_id: str) -> int:
        prepared = self.prepared
        table = prepared.batches[batch_id].table
        select = ", ".join(load_exprs(prepared, batch_id))
        where = self._held_filter(batch_id)
        conn = self.conn
        conn.execute("SAVEPOINT gate_load")
        cur = conn.execute(f"INSERT INTO wh_{table} ({', '.join(WAREHOUSE_COLUMNS[table])}) "
                           f"SELECT {select}, ? FROM {prepared.staging[batch_id]}{where}", (batch_id,))
        conn.execute("RELEASE gate_load")
        return cur.rowcount

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.prepared.release_db(self.conn, self._borrowed)


PREPARED_CASE = PreparedCaseV2
