"""The SQL that compares a batch with the warehouse and its past, written once.

careful-v2 sends these queries through `run_sql` like any agent; gate's own checks (the gold
rows, the Dagster asset checks) run the same text on the prepared database. Each returns few
rows: the earlier nights' figures, the batch's keys the warehouse already holds, the batch's
customers it lacks, the number of rows repeating a warehouse row.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from .contract import KEY_COLUMNS


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def usual_sql(table: str, source: str) -> str:
    """The earlier nights' batches of a table and source: their row counts and median amounts."""
    return (f"SELECT rows, amount_median FROM wh_load_log WHERE table_name = {_lit(table)} "
            f"AND source = {_lit(source)} ORDER BY night, batch_id")


def existing_keys_sql(table: str, staging: str, tonight: Sequence[str] = ()) -> str:
    """The batch's keys the warehouse already holds (rows loaded tonight by `tonight`'s batches aside)."""
    key = KEY_COLUMNS[table]
    skip = f" AND w.batch_id NOT IN ({', '.join(map(_lit, tonight))})" if tonight else ""
    return f"SELECT DISTINCT s.{key} FROM {staging} s JOIN wh_{table} w ON w.{key} = s.{key}{skip}"


def missing_customers_sql(staging: str, also: Sequence[str] = (), held: Sequence[str] = ()) -> str:
    """The batch's customer ids neither wh_customers nor the staging tables `also` hold (rows whose key is
    in `held`, the rows held back from those batches' loads, aside)."""
    skip = f" WHERE customer_id NOT IN ({', '.join(map(_lit, held))})" if held else ""
    others = "".join(f" AND s.customer_id NOT IN (SELECT customer_id FROM {t}{skip})" for t in also)
    return (f"SELECT DISTINCT s.customer_id FROM {staging} s WHERE NOT EXISTS "
            f"(SELECT 1 FROM wh_customers c WHERE c.customer_id = s.customer_id){others}")


def repeated_rows_sql(staging: str, tonight: Sequence[str] = ()) -> str:
    """How many of an orders batch's rows repeat a warehouse row in everything but the order id."""
    skip = f" AND w.batch_id NOT IN ({', '.join(map(_lit, tonight))})" if tonight else ""
    return (f"SELECT COUNT(*) FROM {staging} s WHERE EXISTS (SELECT 1 FROM wh_orders w WHERE "
            f"w.customer_id = s.customer_id AND w.order_date = s.order_date AND w.amount = CAST(s.amount AS REAL) "
            f"AND w.currency = s.currency AND w.status = s.status AND w.order_id <> s.order_id{skip})")


def usual(rows: list) -> tuple[float | None, float | None]:
    """(median row count, median of the median amounts) of the earlier nights' rows of `usual_sql`."""
    counts = [r[0] for r in rows if isinstance(r[0], (int, float))]
    medians = [r[1] for r in rows if isinstance(r[1], (int, float))]
    return (float(statistics.median(counts)) if counts else None,
            float(statistics.median(medians)) if medians else None)
