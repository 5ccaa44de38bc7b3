"""The data contract: loading and validating contract documents (YAML under `contracts/`).

The contract is the one document an agent is given (`read_contract` returns it verbatim), and
the one document gate's pandera schemas are built from (`schemas.py`). A malformed file is
refused with one error naming the file and the key, before anything uses it.

Each suite has its contract and its vocabulary. The classic contract (`classic.yaml`) is
validated strictly: its five keys and nothing else. A v2 contract (`v2.yaml`, suite v2) has
the classic keys over the v2 columns (orders gain a free-text `note`) and defect types, plus
four sections of its own (`files`, `history`, `row_quarantine`, `ask_owner`), each validated
key by key: a v2 section in a classic contract, or an unknown key in a v2 section, is refused.
A contract file's suite is its name (`v2.yaml` is validated as v2, anything else as classic).
"""
from __future__ import annotations

import copy
import math
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

# The vocabulary and column order every part of gate shares (CONFORMANCE §1-2).
DEFECT_TYPES: tuple[str, ...] = (
    "duplicate_key", "missing_value", "invalid_value", "orphan_reference",
    "out_of_range", "wrong_currency", "out_of_window",
)
COLUMNS: dict[str, tuple[str, ...]] = {
    "orders": ("order_id", "customer_id", "amount", "currency", "status", "order_date"),
    "customers": ("customer_id", "email", "country", "signup_date"),
}
TABLES = tuple(COLUMNS)
CONTRACT_KEYS = ("reporting_window", "orders", "customers", "limits", "defect_types")

# Suite v2's vocabulary: the classic one, orders with a free-text note, five more defect types.
COLUMNS_V2: dict[str, tuple[str, ...]] = {"orders": (*COLUMNS["orders"], "note"), "customers": COLUMNS["customers"]}
DEFECT_TYPES_V2: tuple[str, ...] = (
    *DEFECT_TYPES, "wrong_type", "schema_drift", "unit_shift", "volume_anomaly", "duplicate_content")
KEY_COLUMNS = {"orders": "order_id", "customers": "customer_id"}  # a row's key (row quarantine names rows by it)
V2_SECTIONS = ("files", "history", "row_quarantine", "ask_owner")
CONTRACT_KEYS_V2 = (*CONTRACT_KEYS, *V2_SECTIONS)
SUITES = ("classic", "v2")
SUITE_COLUMNS = {"classic": COLUMNS, "v2": COLUMNS_V2}
SUITE_DEFECT_TYPES = {"classic": DEFECT_TYPES, "v2": DEFECT_TYPES_V2}

# the contracts shipped with gate (settings.SHIPPED_CONTRACTS; a link to contracts/ in a clone)
SHIPPED_CONTRACTS = Path(__file__).resolve().parent / "data" / "contracts"


class ContractError(ValueError):
    """A contract document that cannot be used; the message names the file and the key."""


def _need(doc: dict, path: str, kind: type | tuple, where: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ContractError(f"{where}: missing key '{path}'")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ContractError(f"{where}: key '{path}' must be a {names}, not {type(node).__name__}")
    return node


def validate_contract(doc: Any, where: str = "contract", suite: str = "classic") -> dict:
    """Check a contract document's shape for its suite; return it unchanged or raise ContractError."""
    if suite not in SUITES:
        raise ContractError(f"{where}: unknown suite {suite!r} (suites: {', '.join(SUITES)})")
    if not isinstance(doc, dict):
        raise ContractError(f"{where}: a contract must be a mapping, not {type(doc).__name__}")
    keys = CONTRACT_KEYS if suite == "classic" else CONTRACT_KEYS_V2
    unknown = sorted(str(k) for k in doc if k not in keys)
    if unknown:
        raise ContractError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(keys)})")
    columns_of, defect_types = SUITE_COLUMNS[suite], SUITE_DEFECT_TYPES[suite]
    for key in ("start", "end"):
        value = _need(doc, f"reporting_window.{key}", str, where)
        try:
            ok = len(value) == 10 and date.fromisoformat(value).isoformat() == value
        except ValueError:
            ok = False
        if not ok:
            raise ContractError(f"{where}: key 'reporting_window.{key}' must be a real date YYYY-MM-DD, not {value!r}")
    for table, columns in columns_of.items():
        section = _need(doc, table, dict, where)
        for column, text in section.items():
            if column not in columns:
                raise ContractError(f"{where}: key '{table}.{column}' is not a column of {table} {list(columns)}")
            if not isinstance(text, str):
                raise ContractError(f"{where}: key '{table}.{column}' must be a str, not {type(text).__name__}")
    cap = _need(doc, "limits.max_amount", (int, float), where)
    if not 0 < cap < 1e15 or not math.isfinite(cap):
        shown = f"{cap!r}" if not isinstance(cap, int) or cap.bit_length() < 64 else "a number too large"
        raise ContractError(f"{where}: key 'limits.max_amount' must be a positive number below 1e15, not {shown}")
    if not _need(doc, "limits.currency", str, where).strip():
        raise ContractError(f"{where}: key 'limits.currency' must not be blank")
    for key in ("allowed_status", "allowed_countries"):
        values = _need(doc, f"limits.{key}", list, where)
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise ContractError(f"{where}: key 'limits.{key}' must be a non-empty list of non-blank strings")
    types = _need(doc, "defect_types", list, where)
    unknown = [t for t in types if t not in defect_types]
    if unknown:
        raise ContractError(f"{where}: key 'defect_types' has unknown types {unknown}")
    if suite == "v2":
        _validate_v2_sections(doc, where)
    return doc


# What each v2 section holds: key -> kind. "text" a non-blank string, "ratio" a positive finite
# number, "share" a number in (0, 1], "cost" a number in [0, 1], "count" a whole number 0..1000,
# "table" a table name, "defects" a list of v2 defect types, "columns" a list of column names,
# "layout" each table's columns in the order the loader maps them (the v2 vocabulary, exactly:
# a file's header is checked against it), a dict a nested section of the same kind.
V2_SECTION_KEYS: dict[str, dict] = {
    "files": {"columns": "layout", "header": "text", "loader": "text", "blank": "text"},
    "history": {
        "load_log": "text", "compare_with": "text",
        "volume": {"table": "table", "min_ratio": "ratio", "max_ratio": "ratio", "rule": "text"},
        "amount_median": {"min_ratio": "ratio", "max_ratio": "ratio", "rule": "text"},
        "duplicate_content": {"max_share": "share", "rule": "text"},
    },
    "row_quarantine": {"max_rows": "count", "row_level_defects": "defects", "rule": "text"},
    "ask_owner": {"columns": "columns", "cost_per_question": "cost", "rule": "text"},
}


def _check_v2_value(value: Any, kind: str, key: str, where: str) -> None:
    def bad(what: str):
        raise ContractError(f"{where}: key '{key}' must be {what}")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            bad("a non-blank string")
    elif kind == "ratio":
        if not number or not math.isfinite(value) or not 0 < value < 1e6:
            bad("a positive number below 1e6")
    elif kind == "share":
        if not number or not 0 < value <= 1:
            bad("a number above 0 and at most 1")
    elif kind == "cost":
        if not number or not 0 <= value <= 1:
            bad("a number from 0 to 1")
    elif kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
            bad("a whole number from 0 to 1000")
    elif kind == "table":
        if value not in COLUMNS_V2:
            bad(f"one of {list(COLUMNS_V2)}")
    elif kind == "defects":
        if not isinstance(value, list) or not value or not all(v in DEFECT_TYPES_V2 for v in value):
            bad(f"a non-empty list of defect types from {list(DEFECT_TYPES_V2)}")
    elif kind == "layout":
        if value != {t: list(c) for t, c in COLUMNS_V2.items()}:
            bad(f"the v2 tables' columns in the loader's order: {({t: list(c) for t, c in COLUMNS_V2.items()})}")
    elif kind == "columns":
        known = sorted({c for cols in COLUMNS_V2.values() for c in cols})
        if not isinstance(value, list) or not value or not all(v in known for v in value):
            bad(f"a non-empty list of columns from {known}")


def _check_v2_section(node: Any, spec: dict, path: str, where: str) -> None:
    if not isinstance(node, dict):
        raise ContractError(f"{where}: key '{path}' must be a mapping, not {type(node).__name__}")
    unknown = sorted(str(k) for k in node if k not in spec)
    if unknown:
        raise ContractError(f"{where}: unknown key '{path}.{unknown[0]}' (keys: {', '.join(spec)})")
    for key, kind in spec.items():
        if key not in node:
            raise ContractError(f"{where}: missing key '{path}.{key}'")
        if isinstance(kind, dict):
            _check_v2_section(node[key], kind, f"{path}.{key}", where)
        else:
            _check_v2_value(node[key], kind, f"{path}.{key}", where)


def _validate_v2_sections(doc: dict, where: str) -> None:
    """The four v2 sections: every key present, known and of its kind; ratio ranges that are ranges."""
    for section in V2_SECTIONS:
        if section not in doc:
            raise ContractError(f"{where}: missing key '{section}'")
        _check_v2_section(doc[section], V2_SECTION_KEYS[section], section, where)
    for name in ("volume", "amount_median"):
        rule = doc["history"][name]
        if rule["min_ratio"] >= rule["max_ratio"]:
            raise ContractError(f"{where}: key 'history.{name}' has min_ratio {rule['min_ratio']!r} "
                                f"not below max_ratio {rule['max_ratio']!r}")
    stated = set(doc["defect_types"])
    missing = [t for t in doc["row_quarantine"]["row_level_defects"] if t not in stated]
    if missing:
        raise ContractError(f"{where}: key 'row_quarantine.row_level_defects' names types the contract's "
                            f"defect_types do not list: {missing}")


MAX_YAML_BYTES = 100_000
MAX_YAML_DEPTH = 20


def _check_events(text: str, path: Path) -> None:
    """Refuse what a contract never needs and a hostile file uses: anchors and aliases (a few lines
    can stand for millions of values once expanded) and nesting past MAX_YAML_DEPTH."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ContractError(f"{path}: YAML anchors and aliases are not allowed")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ContractError(f"{path}: YAML nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def read_yaml(path: str | Path, what: str = "contract") -> Any:
    """One YAML document from a file; an unreadable, oversized or hostile file, or bad YAML, is a
    ContractError naming it."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_YAML_BYTES:
            raise ContractError(f"{path}: a {what} file is at most {MAX_YAML_BYTES:,} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"{path}: cannot read {what} ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        _check_events(text, path)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ContractError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        raise ContractError(f"{path}: not a usable {what} ({str(exc).splitlines()[0][:200]})") from None


def suite_of_contract_file(path: str | Path) -> str:
    """The suite a contract file is validated as: its name when that names a suite, else classic."""
    stem = Path(path).stem
    return stem if stem in SUITES else "classic"


def load_contract_file(path: str | Path) -> dict:
    """Read and validate one contract YAML file (as its suite's contract)."""
    return validate_contract(read_yaml(path), str(path), suite_of_contract_file(path))


@lru_cache(maxsize=None)
def _cached(path: str) -> dict:
    return load_contract_file(path)


def load_contract(name: str = "classic", directory: str | Path | None = None) -> dict:
    """The named contract in `directory` (default: the shipped contracts), a fresh copy."""
    return copy.deepcopy(_cached(str(Path(directory or SHIPPED_CONTRACTS) / f"{name}.yaml")))
