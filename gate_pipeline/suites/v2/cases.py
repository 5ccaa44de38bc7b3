"""Reading a v2 case strictly: every file parsed once, every label checked against the rows.

The kernel (`kernel.cases.load_case`) checks what every suite's cases share and hands the rest
of a case whose `suite` is "v2" here. A case that cannot be played is
refused with the file, the line and what is wrong, never later with a traceback: a header that
is not a list of plain column names, a row with the wrong number of fields, a cell too long,
an amount the loader would turn into an infinite number, a label naming a column, a type or a
key the batch does not have, a ruling about a batch that does not exist.
"""
from __future__ import annotations

import csv
import math
import re

from ...kernel.cases import bad_text, fail
from ...kernel.contract import is_date
from .contract import COLUMNS_V2, DEFECT_TYPES_V2, KEY_COLUMNS
from .files import reader
from .layout import LOAD_LOG_COLUMNS, WAREHOUSE_COLUMNS
from .owner import LISTED, REJECT_AS, RULED_COLUMNS

CASE_KEYS = ("batches", "case_id", "contract", "family", "night", "owner", "prompt", "seed", "suite", "variant",
             "warehouse")
BATCH_KEYS = ("batch_id", "csv", "row_count", "source", "table", "truth")
DISPOSITIONS = ("load", "rows", "quarantine")
RULINGS = ("accept", "reject")
RULING_KEYS = {"column", "value", "ruling", "answer", "defect_type"}
HEADER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_COLUMNS = 64
MAX_AMOUNT = 1e15
MAX_TEXT = 20_000


def _bad_amount(v: str) -> str | None:
    try:
        x = float(v.strip())
    except ValueError:
        return None  # the loader makes it 0.0: a defect for the agent to find, not a broken case
    if not math.isfinite(x) or abs(x) >= MAX_AMOUNT:
        return f"is {v[:40]!r}: an amount the loader reads must be a finite number below {MAX_AMOUNT:.0e} in magnitude"
    return None


def _parse(text, where: str, header_fixed=None, amount_at: int | None = None,
           number_columns=()) -> tuple[list[str], int]:
    """(header, row count) of one CSV text, checked."""
    if not isinstance(text, str):
        raise fail(where, f"must be CSV text, not {type(text).__name__}")
    it = reader(text)
    try:
        header = next(it, None)
        if header is None:
            raise fail(where, "has no header line")
        if header_fixed is not None and tuple(header) != tuple(header_fixed):
            raise fail(where, f"header must be {list(header_fixed)}, not {header[:10]}")
        if not 1 <= len(header) <= MAX_COLUMNS:
            raise fail(where, f"header must name 1 to {MAX_COLUMNS} columns")
        seen = set()
        for name in header:
            if not HEADER_NAME.match(name):
                raise fail(where, f"header column {name[:80]!r} is not a plain name (letters, digits, '_')")
            if name.lower() in seen:
                raise fail(where, f"header column {name!r} repeats")
            seen.add(name.lower())
        width = len(header)
        count = 0
        numbers = [header.index(c) for c in number_columns if c in header]
        for n, row in enumerate(it, 1):
            if len(row) != width:
                raise fail(where, f"row {n} has {len(row)} fields; the header has {width}")
            for v in row:
                if len(v) > 100 or not v.isascii():
                    problem = bad_text(v)
                    if problem:
                        raise fail(where, f"row {n}: a value {problem}")
            if amount_at is not None and amount_at < width:
                problem = _bad_amount(row[amount_at])
                if problem:
                    raise fail(where, f"row {n}: amount {problem}")
            for i in numbers:
                if row[i] != "":
                    try:
                        ok = math.isfinite(float(row[i]))
                    except ValueError:
                        ok = False
                    if not ok:
                        raise fail(where, f"row {n}: {header[i]} {row[i][:40]!r} is not a number")
            count += 1
    except csv.Error as exc:
        raise fail(where, f"is not readable CSV ({exc})") from None
    return header, count


def _keys_of(text: str, key: str) -> set[str]:
    it = reader(text)
    header = next(it)
    if key not in header:
        return set()
    i = header.index(key)
    return {row[i] for row in it}


def _check_truth(truth, table: str, header: list[str], text: str, where: str) -> None:
    if not isinstance(truth, dict) or not isinstance(truth.get("defective"), bool):
        raise fail(where, "'truth' must be an object with a boolean 'defective'")
    disposition = truth.get("disposition")
    if disposition not in DISPOSITIONS or (disposition == "load") == truth["defective"]:
        raise fail(where, f"truth.disposition must be one of {list(DISPOSITIONS)}, 'load' exactly when not defective")
    defects = truth.get("defects")
    if not isinstance(defects, list) or (truth["defective"] and not defects) or (not truth["defective"] and defects):
        raise fail(where, "truth.defects must list the defects of a defective batch, and none of a clean one")
    keys_in_batch = None
    for d in defects:
        if not isinstance(d, dict) or d.get("type") not in DEFECT_TYPES_V2 or d.get("column") not in COLUMNS_V2[table]:
            raise fail(where, f"truth.defects entries need a column of {table} and a known type")
        accepted = d.get("accepted", []) or []
        if not isinstance(accepted, list):
            raise fail(where, "truth.defects[].accepted must be a list")
        for alt in accepted:
            if not isinstance(alt, dict) or alt.get("type") not in DEFECT_TYPES_V2 \
                    or alt.get("column") not in COLUMNS_V2[table]:
                raise fail(where, f"truth.defects[].accepted entries need a column of {table} and a known type")
        keys = d.get("keys", [])
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise fail(where, "truth.defects[].keys must be a list of strings")
        if disposition == "rows":
            if not keys:
                raise fail(where, "a batch whose disposition is 'rows' names the keys of every defect's rows")
            if keys_in_batch is None:
                keys_in_batch = _keys_of(text, KEY_COLUMNS[table])
            unknown = [k for k in keys if k not in keys_in_batch]
            if unknown:
                raise fail(where, f"truth.defects[].keys names {unknown[0]!r}, which no row of the batch has")


def _check_owner(owner, limits: dict, where: str) -> None:
    if not isinstance(owner, list):
        raise fail(where, "'owner' must be a list of rulings")
    seen = set()
    for n, r in enumerate(owner):
        if not isinstance(r, dict) or not set(r) <= RULING_KEYS or r.get("column") not in RULED_COLUMNS \
                or r.get("ruling") not in RULINGS or not all(isinstance(r.get(k), str) for k in ("value", "answer")):
            raise fail(where, f"owner[{n}] must be a ruling: column ({' or '.join(RULED_COLUMNS)}), value, ruling "
                              f"({' or '.join(RULINGS)}), answer and, for a rejection, defect_type; no batch_id "
                              f"(the owner rules on values: regenerate a v2 file written before)")
        if r.get("defect_type") != (REJECT_AS[r["column"]] if r["ruling"] == "reject" else None):
            raise fail(where, f"owner[{n}]: a rejection of a {r['column']} is cited as {REJECT_AS[r['column']]} "
                              f"(its defect_type), an acceptance names no defect_type")
        if r["value"] in LISTED[r["column"]](limits):
            raise fail(where, f"owner[{n}] rules on {r['value'][:40]!r}, which the contract lists")
        if len(r["answer"]) > MAX_TEXT or len(r["value"]) > MAX_TEXT:
            raise fail(where, f"owner[{n}] is too long")
        if (r["column"], r["value"]) in seen:
            raise fail(where, f"owner[{n}] rules on {r['column']} {r['value'][:40]!r} a second time")
        seen.add((r["column"], r["value"]))


def check_case(case: dict, where: str) -> None:
    """What a v2 case holds before its batches: its seed and variant, its night, the warehouse's past."""
    for key in ("seed", "variant"):
        if isinstance(case[key], bool) or not isinstance(case[key], int):
            raise fail(where, f"'{key}' must be a whole number")
    if not is_date(case["night"]):
        raise fail(where, f"'night' must be a date YYYY-MM-DD, not {str(case['night'])[:40]!r}")
    wh = case["warehouse"]
    if not isinstance(wh, dict) or set(wh) != {"customers", "orders", "load_log"}:
        raise fail(where, "'warehouse' must be an object with 'customers', 'orders' and 'load_log'")
    _parse(wh["customers"], f"{where} warehouse.customers", WAREHOUSE_COLUMNS["customers"])
    _parse(wh["orders"], f"{where} warehouse.orders", WAREHOUSE_COLUMNS["orders"], amount_at=2,
           number_columns=("amount",))
    _parse(wh["load_log"], f"{where} warehouse.load_log", LOAD_LOG_COLUMNS,
           number_columns=("rows", "amount_total", "amount_median"))


def check_batch(batch: dict, where: str) -> None:
    """One staged file: readable CSV with a plain header, its row count, a truth label that fits its rows."""
    table = batch["table"]
    header, count = _parse(batch["csv"], f"{where} csv", amount_at=2 if table == "orders" else None)
    if isinstance(batch["row_count"], bool) or batch["row_count"] != count:
        raise fail(where, f"'row_count' must be the number of rows of its csv ({count})")
    _check_truth(batch["truth"], table, header, batch["csv"], where)


def check_rest(case: dict, where: str) -> None:
    """The owner's rulings, one for each value it rules on."""
    _check_owner(case["owner"], case["contract"]["limits"], where)
