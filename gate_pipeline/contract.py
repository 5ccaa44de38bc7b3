"""The data contract: loading and validating contract documents (YAML under `contracts/`).

The contract is the one document an agent is given (`read_contract` returns it verbatim), and
the one document gate's pandera schemas are built from (`schemas.py`). A malformed file is
refused with one error naming the file and the key, before anything uses it.
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


def validate_contract(doc: Any, where: str = "contract") -> dict:
    """Check a contract document's shape; return it unchanged or raise ContractError."""
    if not isinstance(doc, dict):
        raise ContractError(f"{where}: a contract must be a mapping, not {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in CONTRACT_KEYS)
    if unknown:
        raise ContractError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(CONTRACT_KEYS)})")
    for key in ("start", "end"):
        value = _need(doc, f"reporting_window.{key}", str, where)
        try:
            ok = len(value) == 10 and date.fromisoformat(value).isoformat() == value
        except ValueError:
            ok = False
        if not ok:
            raise ContractError(f"{where}: key 'reporting_window.{key}' must be a real date YYYY-MM-DD, not {value!r}")
    for table, columns in COLUMNS.items():
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
    unknown = [t for t in types if t not in DEFECT_TYPES]
    if unknown:
        raise ContractError(f"{where}: key 'defect_types' has unknown types {unknown}")
    return doc


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


def load_contract_file(path: str | Path) -> dict:
    """Read and validate one contract YAML file."""
    return validate_contract(read_yaml(path), str(path))


@lru_cache(maxsize=None)
def _cached(path: str) -> dict:
    return load_contract_file(path)


def load_contract(name: str = "classic", directory: str | Path | None = None) -> dict:
    """The named contract in `directory` (default: the shipped contracts), a fresh copy."""
    return copy.deepcopy(_cached(str(Path(directory or SHIPPED_CONTRACTS) / f"{name}.yaml")))
