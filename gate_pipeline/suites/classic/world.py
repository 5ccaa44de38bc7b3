"""The classic episode world: staging, warehouse, the loader that never complains, the revenue mart.

`ClassicPreparedCase` does once per case what every episode of it shares: the SQLite image (seed
warehouse plus one staging table per batch), the loader's rows, the profiles, the list of
batches and the mart a correct run would give. `ClassicWorld` is one episode's state on a private
in-memory copy of that image; the seven tools (`tools.py`) are the only way an agent
touches it, and the grader (`grader.py`) reads it afterwards.
"""
from __future__ import annotations

import math
from collections import Counter
from functools import cache, cached_property
from operator import itemgetter

from ...kernel.cases import Case
from ...kernel.sandbox import Sandbox
from ...kernel.world import PreparedCase, World, connect, revenue_of, scratch
from .contract import COLUMNS

WAREHOUSE_TABLES = (  # (name, the statement that creates it), in creation order
    ("wh_customers", "CREATE TABLE wh_customers (customer_id TEXT, email TEXT, country TEXT, signup_date TEXT)"),
    ("wh_orders", "CREATE TABLE wh_orders (order_id TEXT, customer_id TEXT, amount REAL, currency TEXT, "
                  "status TEXT, order_date TEXT)"),
)


def loader_amount(value) -> float:
    """What the loader makes of an amount: a float, and 0.0 for anything it cannot parse."""
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return 0.0


def _staging_ddl(name: str, columns) -> str:
    return f"CREATE TABLE {name} ({', '.join(c + ' TEXT' for c in columns)})"


def _insert_sql(table: str, columns) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


_ROW = {table: itemgetter(*columns) for table, columns in COLUMNS.items()}  # a row dict -> its values in order


def _loader_amounts(amounts: tuple) -> list[float]:
    """`loader_amount` of each amount, the common case (every amount a number's text) decided in C: float()
    strips the whitespace str.strip() does, and a case's values are text or null."""
    try:
        return list(map(float, amounts))
    except (TypeError, ValueError):
        return list(map(loader_amount, amounts))


def _wh_rows(table: str, rows: list[dict]) -> list[tuple]:
    """The rows as the loader writes them to wh_<table>: values in column order, amounts as floats."""
    values = list(map(_ROW[table], rows))
    if table == "orders" and values:
        o, c, a, cur, st, d = zip(*values)
        return list(zip(o, c, _loader_amounts(a), cur, st, d))
    return values


def mart_of(customer_ids, orders) -> float:
    """The revenue mart computed from rows rather than a database: SUM(amount) over orders joined to
    customers on customer_id, so a customer id present k times counts its orders k times and an
    order with no customer drops out (NULL ids never join; NULL amounts, as SQLite stores NaN, are
    skipped). `orders` is (customer_id, amount) pairs. Rounded to cents as `mart_revenue` is."""
    counts = Counter(c for c in customer_ids if c is not None)
    return revenue_of(math.fsum(a * counts[c] for c, a in orders if c in counts and a == a))


def _profile_column(values: list) -> dict:
    present = [v for v in values if v is not None]
    numeric = []
    for v in present:
        try:
            numeric.append(float(str(v).strip()))
        except ValueError:
            pass
    counts = Counter(present)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:8]
    return {
        "n_null": len(values) - len(present),
        "n_blank": sum(1 for v in present if str(v).strip() == ""),
        "n_distinct": len({str(v) for v in values}),
        "min": min(present, key=str) if present else None,
        "max": max(present, key=str) if present else None,
        "numeric_min": min(numeric) if numeric else None,
        "numeric_max": max(numeric) if numeric else None,
        "top_values": [[v, n] for v, n in top],
    }


def profile(batch) -> dict:
    columns = COLUMNS[batch.table]
    rows = batch.data["rows"]
    return {"batch_id": batch.batch_id, "table": batch.table, "rows": len(rows),
            "columns": {c: _profile_column([r.get(c) for r in rows]) for c in columns}}


@cache
def _empty_warehouse() -> bytes:
    """The image of a database holding the two empty warehouse tables (built once per process)."""
    conn = connect()
    try:
        for _, ddl in WAREHOUSE_TABLES:
            conn.execute(ddl)
        return conn.serialize()
    finally:
        conn.close()


class ClassicPreparedCase(PreparedCase):
    """Everything an episode of a classic case can share. Build once per case, then open many worlds."""

    def __init__(self, case: Case):
        super().__init__(case)
        warehouse = case.data["warehouse"]
        self.seed_rows = {table: _wh_rows(table, warehouse[table]) for table in COLUMNS}
        self.wh_customer_ids = frozenset(r[0] for r in self.seed_rows["customers"])
        self._load_rows: dict[str, list[tuple]] = {}
        # the image's schema as the sandbox's compile check reads it (name, CREATE statement), in creation order:
        # the statements below, which SQLite keeps as written (tests/test_sandbox.py checks it against the image)
        self.catalogue = [*WAREHOUSE_TABLES] + [
            (self.staging[bid], _staging_ddl(self.staging[bid], COLUMNS[batch.table]))
            for bid, batch in self.batches.items()]
        self.image = self._build_image()

    def load_rows(self, batch_id: str) -> list[tuple]:
        """The rows the loader writes for a batch (made on first use: a defective batch is seldom loaded)."""
        rows = self._load_rows.get(batch_id)
        if rows is None:
            batch = self.batches[batch_id]
            rows = self._load_rows[batch_id] = _wh_rows(batch.table, batch.data["rows"])
        return rows

    def row_count(self, batch_id: str) -> int:
        return len(self.batches[batch_id].data["rows"])

    def _build_image(self) -> bytes:
        conn = scratch()
        conn.deserialize(_empty_warehouse())
        conn.execute("BEGIN")
        try:
            for table, rows in self.seed_rows.items():
                conn.executemany(_insert_sql(f"wh_{table}", COLUMNS[table]), rows)
            for (name, ddl), batch in zip(self.catalogue[len(WAREHOUSE_TABLES):], self.batches.values()):
                conn.execute(ddl)
                conn.executemany(_insert_sql(name, COLUMNS[batch.table]), list(map(_ROW[batch.table], batch.data["rows"])))
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back itself (out of memory): its error is the one raised
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return conn.serialize()

    def preview(self, batch_id: str, n: int) -> tuple[list[str], list[list]]:
        batch = self.batches[batch_id]
        cols = list(COLUMNS[batch.table])
        return cols, [[r.get(c) for c in cols] for r in batch.data["rows"][:n]]

    def profile_of(self, batch_id: str) -> dict:
        return profile(self.batches[batch_id])

    def warehouse_rows(self) -> dict[str, int]:
        return {table: len(rows) for table, rows in self.seed_rows.items()}

    @cached_property
    def gold_rows(self) -> list[tuple]:
        """The staging rows that break each defective batch's rule (the dense reward's target)."""
        from .gold import gold_rows  # pandas + pandera: only when the dense reward is used
        return gold_rows(self.case)

    @cached_property
    def correct_mart(self) -> float:
        """The mart if every batch were handled as the contract says: the seed warehouse plus every
        clean batch loaded once (which order they load in does not change the sum)."""
        customers = [r[0] for r in self.seed_rows["customers"]]
        orders = [(r[1], r[2]) for r in self.seed_rows["orders"]]
        for bid in self.order:
            if not self.truth[bid]["defective"]:
                rows = self.load_rows(bid)
                if self.batches[bid].table == "customers":
                    customers += [r[0] for r in rows]
                else:
                    orders += [(r[1], r[2]) for r in rows]
        return mart_of(customers, orders)


class ClassicWorld(World):
    """One classic episode's warehouse and bookkeeping, on a private copy of the case's image."""

    def __init__(self, prepared: ClassicPreparedCase, listener=None, deferred_ledger: bool = False):
        conn = connect()
        conn.deserialize(prepared.image)
        super().__init__(prepared, conn, Sandbox(conn, catalogue=prepared.catalogue), listener, deferred_ledger)
        self.prepared: ClassicPreparedCase = prepared
        self.customer_ids = set(prepared.wh_customer_ids)

    def orphan_rows(self, batch_id: str) -> int:
        """Rows of an orders batch whose customer is not in wh_customers right now."""
        if self.prepared.batches[batch_id].table != "orders":
            return 0
        return sum(1 for r in self.prepared.load_rows(batch_id) if r[1] not in self.customer_ids)

    def load(self, batch_id: str) -> int:
        """The loader: inserts every row, any number of times, and never complains."""
        rows = self.prepared.load_rows(batch_id)
        table = self.prepared.batches[batch_id].table
        if table == "customers":
            self.customer_ids.update(r[0] for r in rows)
        self.conn.execute("BEGIN")
        self.conn.executemany(_insert_sql(f"wh_{table}", COLUMNS[table]), rows)
        self.conn.execute("COMMIT")
        return len(rows)


PREPARED_CASE = ClassicPreparedCase
