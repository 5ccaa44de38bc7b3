"""Contract documents: reading them safely, and the checks of the contract core that suites share.

The contract is the one document an agent is given (`read_contract` returns it verbatim) and the
one gate's checks are built from. A contract file is YAML under `contracts/`, read with a size
limit and without anchors or deep nesting (`read_yaml`); its suite is its name (`v2.yaml` is
checked by suite v2, anything else by the default suite), and the suite checks the document
(`Suite.validate_contract`). A malformed file is refused with one error naming the file and the key.

`check_core` is the contract core both shipped suites use: a reporting window, a section per
table naming its columns' rules in words, the machine-readable limits, the defect types. A suite
states its own keys, tables and defect types; the checks are the same.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from .errors import GateError
from .files import read_text
from .suite import Suite, suites

# the contracts shipped with gate (settings.SHIPPED_CONTRACTS; a link to contracts/ in a clone)
SHIPPED_CONTRACTS = Path(__file__).resolve().parents[1] / "data" / "contracts"


class ContractError(GateError, ValueError):
    """A contract document that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Rule:
    """One rule of a contract: the defect it detects in a table's column, whether it needs the warehouse
    to judge, and its level ("row": one row at a time; a suite may judge at other levels too)."""
    table: str
    column: str
    defect_type: str
    needs_warehouse: bool = False
    level: str = "row"

    @property
    def key(self) -> str:
        return f"{self.table}.{self.column}.{self.defect_type}"


# The rules of the contract core (`check_core`), in the order a careful agent checks them: the classic
# suite's eleven; a suite with more rules places its own among them.
CORE_RULES: tuple[Rule, ...] = (
    Rule("customers", "customer_id", "duplicate_key", True),
    Rule("customers", "email", "missing_value"),
    Rule("customers", "country", "invalid_value"),
    Rule("customers", "signup_date", "out_of_window"),
    Rule("orders", "order_id", "duplicate_key", True),
    Rule("orders", "amount", "missing_value"),
    Rule("orders", "amount", "out_of_range"),
    Rule("orders", "currency", "wrong_currency"),
    Rule("orders", "status", "invalid_value"),
    Rule("orders", "order_date", "out_of_window"),
    Rule("orders", "customer_id", "orphan_reference", True),
)


def rule_keys_option(value, known) -> tuple[str, ...]:
    """An agent's `without` option: a list of rule keys among `known`; anything else is a ValueError."""
    known = list(known)
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"option 'without' must be a list of rule keys, not {value!r}")
    unknown = [v for v in value if v not in known]
    if unknown:
        raise ValueError(f"option 'without': unknown rule {unknown[0]!r}; rules: {', '.join(known)}")
    return tuple(value)


def need(doc: dict, path: str, kind: type | tuple, where: str) -> Any:
    """The value at a dotted key path, of `kind`, or a ContractError naming the key."""
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ContractError(f"{where}: missing key '{path}'")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ContractError(f"{where}: key '{path}' must be a {names}, not {type(node).__name__}")
    return node


def is_date(value) -> bool:
    """A real calendar date written YYYY-MM-DD."""
    try:
        return isinstance(value, str) and len(value) == 10 and date.fromisoformat(value).isoformat() == value
    except ValueError:
        return False


def check_core(doc: Any, where: str, keys: tuple[str, ...], columns: Mapping[str, tuple[str, ...]],
               defect_types: tuple[str, ...]) -> dict:
    """The contract core (see the module docstring) of a document whose keys may be `keys`."""
    if not isinstance(doc, dict):
        raise ContractError(f"{where}: a contract must be a mapping, not {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in keys)
    if unknown:
        raise ContractError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(keys)})")
    for key in ("start", "end"):
        value = need(doc, f"reporting_window.{key}", str, where)
        if not is_date(value):
            raise ContractError(f"{where}: key 'reporting_window.{key}' must be a real date YYYY-MM-DD, not {value!r}")
    window = doc["reporting_window"]
    if window["start"] > window["end"]:  # (dates YYYY-MM-DD compare as text)
        raise ContractError(f"{where}: key 'reporting_window' starts after it ends ({window['start']} > {window['end']})")
    for table, table_columns in columns.items():
        section = need(doc, table, dict, where)
        for column, text in section.items():
            if column not in table_columns:
                raise ContractError(f"{where}: key '{table}.{column}' is not a column of {table} {list(table_columns)}")
            if not isinstance(text, str):
                raise ContractError(f"{where}: key '{table}.{column}' must be a str, not {type(text).__name__}")
    cap = need(doc, "limits.max_amount", (int, float), where)
    if not 0 < cap < 1e15 or not math.isfinite(cap):
        shown = f"{cap!r}" if not isinstance(cap, int) or cap.bit_length() < 64 else "a number too large"
        raise ContractError(f"{where}: key 'limits.max_amount' must be a positive number below 1e15, not {shown}")
    if not need(doc, "limits.currency", str, where).strip():
        raise ContractError(f"{where}: key 'limits.currency' must not be blank")
    for key in ("allowed_status", "allowed_countries"):
        values = need(doc, f"limits.{key}", list, where)
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise ContractError(f"{where}: key 'limits.{key}' must be a non-empty list of non-blank strings")
    types = need(doc, "defect_types", list, where)
    unknown_types = [t for t in types if t not in defect_types]
    if unknown_types:
        raise ContractError(f"{where}: key 'defect_types' has unknown types {unknown_types}")
    return doc


MAX_YAML_BYTES = 100_000
MAX_YAML_DEPTH = 20
_LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"


def _check_events(text: str, path: Path) -> None:
    """Refuse what a contract never needs and a hostile file uses: anchors and aliases (a few lines
    can stand for millions of values once expanded) and nesting past MAX_YAML_DEPTH."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_PARSER):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ContractError(f"{path}: YAML anchors and aliases are not allowed")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ContractError(f"{path}: YAML nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.MarkedYAMLError as exc:  # libyaml's own limit (1,000 levels), met as it reads ahead of the events
        if exc.problem == _LIBYAML_TOO_DEEP:
            raise ContractError(f"{path}: YAML nested deeper than {MAX_YAML_DEPTH} levels") from None
        raise


_BOOL, _INT, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


# libyaml's parser where PyYAML was built with it (its wheels are): every file gate ships reads to the same document,
# about ten times faster (benchmarks/bench_contract_read.py: they are read whenever a process lists its agents, as
# Dagster's code location does as it loads); PyYAML's own otherwise. At the edges the two differ (libyaml reads a
# byte-order mark or a tab inside the text, refuses a few flow forms and unknown directives, reads a bare `!` as ''),
# and what either reads is then checked as a contract or a variant is
_PARSER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _ContractLoader(_PARSER):  # type: ignore[valid-type,misc]
    """YAML as gate reads a contract or a variant: PyYAML's safe loader with the YAML 1.2 core schema's
    numbers and booleans in place of YAML 1.1's (`010000` is ten thousand, not octal 4096; `50:00` is text,
    not 3000; `5.0e4` and `1e5` are numbers, not text; `NO`, `yes` and `off` are text, not booleans), and a key
    named twice in one mapping refused (the last one silently won)."""

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):  # a mapping's tag on a sequence (`!!set [x]`): the base class says so
            return super().construct_mapping(node, deep)
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if twice:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice in one mapping, at line {key_node.start_mark.line + 1}",
                    key_node.start_mark)
        return super().construct_mapping(node, deep)


def _yaml_int(loader, node) -> int:
    text = loader.construct_scalar(node)
    if text[:2] in ("0o", "0x"):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _yaml_float(loader, node) -> float:
    text = loader.construct_scalar(node)
    if text.lower().lstrip("+-") == ".inf":
        return -math.inf if text.startswith("-") else math.inf
    return math.nan if text.lower() == ".nan" else float(text)


_ContractLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ContractLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_ContractLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                      list("-+0123456789"))
_ContractLoader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                       r"|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
_ContractLoader.add_constructor(_INT, _yaml_int)
_ContractLoader.add_constructor(_FLOAT, _yaml_float)


def read_yaml(path: str | Path, what: str = "contract") -> Any:
    """One YAML document from a file (`_ContractLoader`); an unreadable, oversized or hostile file, or bad YAML,
    is a ContractError naming it."""
    path = Path(path)
    text = read_text(path, f"{what} file", MAX_YAML_BYTES, ContractError)  # a regular file only (never a FIFO)
    try:
        _check_events(text, path)
        return yaml.load(text, Loader=_ContractLoader)  # noqa: S506 - a SafeLoader, its resolvers those of YAML 1.2
    except yaml.YAMLError as exc:
        raise ContractError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except ContractError:  # gate's own refusal (a ValueError too), already naming the file
        raise
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        raise ContractError(f"{path}: not a usable {what} ({str(exc).splitlines()[0][:200]})") from None


def suite_of_contract_file(path: str | Path) -> Suite:
    """The suite a contract file is checked by: the suite its name names, else the default suite."""
    stem = Path(path).stem
    return suites.get(stem) if stem in suites.names() else suites.default()


def load_contract_file(path: str | Path) -> dict:
    """Read and check one contract YAML file (by its suite)."""
    return suite_of_contract_file(path).validate_contract(read_yaml(path), str(path))


@lru_cache(maxsize=None)
def _cached(path: str) -> dict:
    return load_contract_file(path)


def load_contract(name: str, directory: str | Path | None = None) -> dict:
    """The named contract in `directory` (default: the shipped contracts), a fresh copy."""
    return copy.deepcopy(_cached(str(Path(directory or SHIPPED_CONTRACTS) / f"{name}.yaml")))
