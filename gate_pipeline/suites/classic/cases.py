"""The classic case format, checked strictly: the seed warehouse and each batch's rows and truth label.

A classic case has no `suite` key. The kernel (`kernel.cases.load_case`) checks what every suite's
cases share; here: the warehouse holds exactly `customers` and `orders`, every row is an object
with exactly its table's columns (a column the table does not have is refused, named), as strings
or null, a cell is bounded and valid text, an amount the
loader would read is finite and below 1e15, and truth labels name a column of the batch's table
and a known defect type.
"""
from __future__ import annotations

import math
from itertools import chain
from operator import itemgetter

from ...kernel.cases import bad_text, bounded_name, fail
from .contract import COLUMNS, DEFECT_TYPES

CASE_KEYS = ("batches", "case_id", "contract", "family", "prompt", "seed", "variant", "warehouse")
BATCH_KEYS = ("batch_id", "rows", "source", "table", "truth")
MAX_AMOUNT = 1e15  # an amount that parses as a number must be finite and below this in magnitude

_VALUES = {table: itemgetter(*columns) for table, columns in COLUMNS.items()}
_WIDTH = {table: len(columns) for table, columns in COLUMNS.items()}
_VALUE_TYPES = frozenset({str, type(None)})
_TEXT = {str}
_AMOUNT = {table: COLUMNS[table].index("amount") if "amount" in COLUMNS[table] else None for table in COLUMNS}


def _bad_amount(v: str) -> str | None:
    try:
        x = float(v.strip())
    except ValueError:
        return None  # the loader makes it 0.0, as a blank: a defect the agent must find
    if x != x or abs(x) >= MAX_AMOUNT:
        return f"is {v!r}: an amount must be a finite number below {MAX_AMOUNT:.0e} in magnitude"
    return None


def _amounts_fine(amounts: list) -> bool:
    """Every amount the loader would read as a number is finite and below MAX_AMOUNT (decided in C)."""
    try:
        xs = list(map(float, amounts))  # float() strips the whitespace str.strip() does
    except ValueError:  # some amount is not a number (a defect the agent must find): value by value
        return all(_bad_amount(v) is None for v in amounts)
    return all(map(math.isfinite, xs)) and max(map(abs, xs), default=0.0) < MAX_AMOUNT


def _rows_fine(rows: list, table: str) -> bool:
    """Whether every row is well formed, decided for the whole list at once: objects of exactly the table's
    columns, string or null values of at most 100 ASCII characters, amounts in range. False says only
    that the row-by-row check must look (it names the first problem, or finds none)."""
    width = _WIDTH[table]
    if not set(map(type, rows)) <= {dict} or not set(map(len, rows)) <= {width}:
        return False
    try:
        values = list(map(_VALUES[table], rows))
    except KeyError:
        return False
    flat = list(chain.from_iterable(values))
    kinds = set(map(type, flat))
    if kinds == _TEXT:  # no nulls (the common case): the values are the texts
        texts = flat
    elif kinds <= _VALUE_TYPES:
        texts = [v for v in flat if v is not None]
    else:
        return False
    if texts and (max(map(len, texts)) > 100 or not "".join(texts).isascii()):
        return False
    amount = _AMOUNT[table]
    return amount is None or _amounts_fine([r[amount] for r in values if r[amount] is not None])


def check_rows(rows, table: str, where: str) -> None:
    if not isinstance(rows, list):
        raise fail(where, f"'rows' must be a list, not {type(rows).__name__}")
    if _rows_fine(rows, table):
        return
    values_of, amount, width = _VALUES[table], _AMOUNT[table], _WIDTH[table]
    for i, row in enumerate(rows):
        if type(row) is not dict:
            raise fail(where, f"row {i} must be an object")
        try:
            values = values_of(row)
        except KeyError:
            raise fail(where, f"row {i} lacks column(s) {[c for c in COLUMNS[table] if c not in row]}") from None
        if len(row) != width:  # it has every column of its table, and more
            extra = next(c for c in row if c not in COLUMNS[table])
            raise fail(where, f"row {i} has a column {table} does not have: {bounded_name(extra)}")
        if not _VALUE_TYPES.issuperset(map(type, values)):
            bad = [c for c in COLUMNS[table] if row[c] is not None and not isinstance(row[c], str)]
            raise fail(where, f"row {i}: value(s) of {bad} must be strings")
        for column, v in zip(COLUMNS[table], values):
            if v is not None and (len(v) > 100 or not v.isascii()):
                problem = bad_text(v)
                if problem:
                    raise fail(where, f"row {i}: {column} {problem}")
        if amount is not None and values[amount] is not None:
            problem = _bad_amount(values[amount])
            if problem:
                raise fail(where, f"row {i}: amount {problem}")


def check_case(case: dict, where: str) -> None:
    wh = case["warehouse"]
    if not isinstance(wh, dict) or set(wh) != {"customers", "orders"}:
        raise fail(where, "'warehouse' must be an object with 'customers' and 'orders'")
    for table in ("customers", "orders"):
        check_rows(wh[table], table, f"{where} warehouse.{table}")


def check_batch(batch: dict, where: str) -> None:
    check_rows(batch["rows"], batch["table"], where)
    truth = batch["truth"]
    if not isinstance(truth, dict) or not isinstance(truth.get("defective"), bool):
        raise fail(where, "'truth' must be an object with a boolean 'defective'")
    for key in ("defects", "accepted"):
        entries = truth.get(key, []) or []
        if not isinstance(entries, list):
            raise fail(where, f"truth.{key} must be a list")
        for d in entries:
            if not isinstance(d, dict) or d.get("type") not in DEFECT_TYPES or d.get("column") not in COLUMNS[batch["table"]]:
                raise fail(where, f"truth.{key} entries need a column of {batch['table']} and a known type")
