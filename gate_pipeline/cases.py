"""Case files: the JSONL format every suite is stored in, read and written exactly.

A case is kept as the plain JSON object it is on disk (so writing it back is byte-identical),
checked on reading: a line that is not JSON, or lacks a key the episode needs, is refused with
the file and the line number. A classic case has no `suite` key; a v2 case has `"suite": "v2"`
and is checked by `suite_v2.cases`.
"""
from __future__ import annotations

import json
from operator import itemgetter
from pathlib import Path
from typing import Iterable

from .contract import COLUMNS, DEFECT_TYPES, ContractError, validate_contract
from .world import staging_table

CASE_KEYS = ("batches", "case_id", "contract", "family", "prompt", "seed", "variant", "warehouse")
BATCH_KEYS = ("batch_id", "rows", "source", "table", "truth")


class CaseError(ValueError):
    """A case file or case object that gate cannot use."""


def dumps_case(case: dict) -> str:
    """One line of a case file: sorted keys, default separators, ASCII-escaped."""
    return json.dumps(case, sort_keys=True) + "\n"


def write_cases(path: str | Path, cases: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for case in cases:
            fh.write(dumps_case(case))
    return path


def _fail(where: str, msg: str) -> CaseError:
    return CaseError(f"{where}: {msg}")


_VALUES = {table: itemgetter(*columns) for table, columns in COLUMNS.items()}
_VALUE_TYPES = frozenset({str, type(None)})


MAX_ID_CHARS = 200  # a case id or batch id (tools refuse longer arguments)
MAX_VALUE_CHARS = 20_000  # a cell (the sandbox's string length limit)
MAX_AMOUNT = 1e15  # an amount that parses as a number must be finite and below this in magnitude
_AMOUNT = {table: COLUMNS[table].index("amount") if "amount" in COLUMNS[table] else None for table in COLUMNS}


def _bad_value(v: str) -> str | None:
    if len(v) > MAX_VALUE_CHARS:
        return f"is {len(v):,} characters long (at most {MAX_VALUE_CHARS:,})"
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode text (a lone surrogate)"
    return None


def _bad_amount(v: str) -> str | None:
    try:
        x = float(v.strip())
    except ValueError:
        return None  # the loader makes it 0.0, as a blank: a defect the agent must find
    if x != x or abs(x) >= MAX_AMOUNT:
        return f"is {v!r}: an amount must be a finite number below {MAX_AMOUNT:.0e} in magnitude"
    return None


def _check_rows(rows, table: str, where: str) -> None:
    if not isinstance(rows, list):
        raise _fail(where, f"'rows' must be a list, not {type(rows).__name__}")
    values_of, amount = _VALUES[table], _AMOUNT[table]
    for i, row in enumerate(rows):
        if type(row) is not dict:
            raise _fail(where, f"row {i} must be an object")
        try:
            values = values_of(row)
        except KeyError:
            raise _fail(where, f"row {i} lacks column(s) {[c for c in COLUMNS[table] if c not in row]}") from None
        if not _VALUE_TYPES.issuperset(map(type, values)):
            bad = [c for c in COLUMNS[table] if row[c] is not None and not isinstance(row[c], str)]
            raise _fail(where, f"row {i}: value(s) of {bad} must be strings")
        for column, v in zip(COLUMNS[table], values):
            if v is not None and (len(v) > 100 or not v.isascii()):
                problem = _bad_value(v)
                if problem:
                    raise _fail(where, f"row {i}: {column} {problem}")
        if amount is not None and values[amount] is not None:
            problem = _bad_amount(values[amount])
            if problem:
                raise _fail(where, f"row {i}: amount {problem}")


def validate_case(case, where: str = "case", checked_contract: dict | None = None) -> dict:
    """Check one case object; return it unchanged or raise CaseError naming `where`.

    `checked_contract` is a contract already validated: a case whose contract equals it (every
    case of a suite carries the same one) is not checked again."""
    if not isinstance(case, dict):
        raise _fail(where, f"a case must be a JSON object, not {type(case).__name__}")
    if "suite" in case:  # classic cases carry no suite; a v2 case says so
        if case["suite"] != "v2":
            raise _fail(where, f"'suite' must be 'v2' (a classic case has no 'suite'), not {str(case['suite'])[:40]!r}")
        from .suite_v2.cases import validate_v2_case
        return validate_v2_case(case, where, _fail, checked_contract, staging_table, MAX_ID_CHARS)
    missing = [k for k in CASE_KEYS if k not in case]
    if missing:
        raise _fail(where, f"case lacks key(s) {missing}")
    if not isinstance(case["case_id"], str) or not case["case_id"] or len(case["case_id"]) > MAX_ID_CHARS \
            or _bad_value(case["case_id"]):
        raise _fail(where, f"'case_id' must be a non-empty string of at most {MAX_ID_CHARS} characters")
    where = f"{where} ({case['case_id']})"
    if checked_contract is None or case["contract"] != checked_contract:
        try:
            validate_contract(case["contract"], f"{where} contract")
        except ContractError as exc:
            raise CaseError(str(exc)) from None
    if not isinstance(case["prompt"], str) or _bad_value(case["prompt"]):
        raise _fail(where, "'prompt' must be a string")
    if not isinstance(case["family"], str) or _bad_value(case["family"]):
        raise _fail(where, "'family' must be a string")
    wh = case["warehouse"]
    if not isinstance(wh, dict) or set(wh) != {"customers", "orders"}:
        raise _fail(where, "'warehouse' must be an object with 'customers' and 'orders'")
    for table in ("customers", "orders"):
        _check_rows(wh[table], table, f"{where} warehouse.{table}")
    batches = case["batches"]
    if not isinstance(batches, list) or not batches:
        raise _fail(where, "'batches' must be a non-empty list")
    staged: dict[str, str] = {}
    for k, batch in enumerate(batches):
        bw = f"{where} batch {k}"
        if not isinstance(batch, dict):
            raise _fail(bw, "a batch must be an object")
        missing = [key for key in BATCH_KEYS if key not in batch]
        if missing:
            raise _fail(bw, f"batch lacks key(s) {missing}")
        bid = batch["batch_id"]
        if not isinstance(bid, str) or not bid or len(bid) > MAX_ID_CHARS or _bad_value(bid):
            raise _fail(bw, f"'batch_id' must be a non-empty string of at most {MAX_ID_CHARS} characters")
        table_name = staging_table(bid)
        if table_name in staged:
            other = staged[table_name]
            raise _fail(bw, f"batch id {bid!r} repeats" if other == bid else
                        f"batch ids {other!r} and {bid!r} would share the staging table {table_name}")
        staged[table_name] = bid
        if not isinstance(batch["table"], str) or batch["table"] not in COLUMNS:
            raise _fail(bw, f"'table' must be one of {list(COLUMNS)}, not {json.dumps(batch['table'])[:80]}")
        if not isinstance(batch["source"], str) or _bad_value(batch["source"]):
            raise _fail(bw, "'source' must be a string")
        _check_rows(batch["rows"], batch["table"], bw)
        truth = batch["truth"]
        if not isinstance(truth, dict) or not isinstance(truth.get("defective"), bool):
            raise _fail(bw, "'truth' must be an object with a boolean 'defective'")
        for key in ("defects", "accepted"):
            for d in truth.get(key, []) or []:
                if not isinstance(d, dict) or d.get("type") not in DEFECT_TYPES or d.get("column") not in COLUMNS[batch["table"]]:
                    raise _fail(bw, f"truth.{key} entries need a column of {batch['table']} and a known type")
    return case


def parse_cases(text: str, where: str) -> list[dict]:
    cases, ids = [], set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CaseError(f"{where}:{lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise CaseError(f"{where}:{lineno}: not a case ({exc})") from None
        except RecursionError:
            raise CaseError(f"{where}:{lineno}: not a case (JSON nested too deep)") from None
        validate_case(obj, f"{where}:{lineno}", cases[-1]["contract"] if cases else None)
        if obj["case_id"] in ids:
            raise CaseError(f"{where}:{lineno}: case id {obj['case_id']!r} repeats")
        ids.add(obj["case_id"])
        cases.append(obj)
    return cases


def read_cases(path: str | Path) -> list[dict]:
    """Every case of a JSONL file, in file order, each validated."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseError(f"{path}: no such case file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(f"{path}: cannot read case file ({exc})") from None
    cases = parse_cases(text, str(path))
    if not cases:
        raise CaseError(f"{path}: no cases in file")
    return cases


def split_of(path: str | Path) -> str:
    """The split a case file holds, by its name: "eval", "train", or the file's stem."""
    stem = Path(path).stem
    return "eval" if "eval" in stem else "train" if "train" in stem else stem


def suite_of(case: dict) -> str:
    """The suite a case belongs to: "v2" when it says so, else "classic"."""
    return case.get("suite", "classic") if isinstance(case, dict) else "classic"


def suite_of_cases(cases) -> str:
    """The suite of a list of cases: "v2" when every case is a v2 case, else "classic"."""
    cases = list(cases)
    return "v2" if cases and all(suite_of(c) == "v2" for c in cases) else "classic"


def defective_ids(case: dict) -> list[str]:
    """Truth labels (grader and oracle attackers only; never shown to an agent)."""
    return [b["batch_id"] for b in case["batches"] if b["truth"]["defective"]]
