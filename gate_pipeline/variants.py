"""Contract-schema variants: the careful baseline's pandera schema, changed one file at a time.

A variant is a YAML file under `contracts/variants/` (the file name is its name). It names a
base contract and says what to change about the schema built from it:

    variant:
      base: classic                      # a contract under contracts/ (required)
      description: "one line"            # shown in tables (required)
      remove_rules: [orders.customer_id.orphan_reference]   # Rule.key from rules.CATALOGUE
      overrides:                         # values the schema uses, replaced
        limits: {max_amount: 10000}
        reporting_window: {end: "2026-09-29"}

The agent still reads the case's own contract through `read_contract`; a variant changes
only what the careful agent makes of it (which rules it checks, which limits it applies).
A file with a wrong key is refused with a ContractError naming the file and the key.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

from .contract import SHIPPED_CONTRACTS, ContractError, load_contract, read_yaml, validate_contract
from .rules import CATALOGUE

VARIANT_KEYS = ("base", "description", "remove_rules", "overrides")
# Every value a variant may override, and the type it must have.
OVERRIDABLE: dict[str, dict[str, type | tuple]] = {
    "limits": {"max_amount": (int, float), "currency": str, "allowed_status": list, "allowed_countries": list},
    "reporting_window": {"start": str, "end": str},
}
RULE_KEYS = tuple(r.key for r in CATALOGUE)
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Variant:
    name: str
    base: str
    description: str
    remove_rules: tuple[str, ...] = ()
    overrides: dict = field(default_factory=dict)
    path: str = ""

    def apply(self, contract: dict) -> dict:
        """The contract the schema is built from: `contract` with this variant's overrides."""
        out = copy.deepcopy(contract)
        for section, values in self.overrides.items():
            out[section] = {**out.get(section, {}), **copy.deepcopy(values)}
        return out


def variants_dir(contracts: str | Path | None = None) -> Path:
    """`variants/` in the contracts directory (default: the shipped contracts)."""
    return Path(contracts or SHIPPED_CONTRACTS) / "variants"


def _type_name(kind) -> str:
    return kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)


def _check_overrides(overrides, where: str) -> dict:
    if not isinstance(overrides, dict):
        raise ContractError(f"{where}: key 'variant.overrides' must be a mapping, not {type(overrides).__name__}")
    for section, values in overrides.items():
        if section not in OVERRIDABLE:
            raise ContractError(f"{where}: key 'variant.overrides.{section}' cannot be overridden "
                                f"(only {', '.join(OVERRIDABLE)})")
        if not isinstance(values, dict):
            raise ContractError(f"{where}: key 'variant.overrides.{section}' must be a mapping, "
                                f"not {type(values).__name__}")
        for key, value in values.items():
            kind = OVERRIDABLE[section].get(key)
            if kind is None:
                raise ContractError(f"{where}: key 'variant.overrides.{section}.{key}' cannot be overridden "
                                    f"(only {', '.join(OVERRIDABLE[section])})")
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ContractError(f"{where}: key 'variant.overrides.{section}.{key}' must be a "
                                    f"{_type_name(kind)}, not {type(value).__name__}")
            if kind is list and not (value and all(isinstance(v, str) and v for v in value)):
                raise ContractError(f"{where}: key 'variant.overrides.{section}.{key}' must be a non-empty "
                                    f"list of strings")
    return overrides


def _check_rules(rules, where: str) -> tuple[str, ...]:
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ContractError(f"{where}: key 'variant.remove_rules' must be a list of rule keys")
    for rule in rules:
        if rule not in RULE_KEYS:
            raise ContractError(f"{where}: key 'variant.remove_rules' names unknown rule {rule!r}; "
                                f"rules: {', '.join(RULE_KEYS)}")
    return tuple(rules)


def parse_variant(doc, name: str, where: str, contracts: str | Path | None = None) -> Variant:
    """Check one variant document; return the Variant or raise ContractError naming `where` and the key."""
    if not NAME_RE.match(name):
        raise ContractError(f"{where}: variant name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    if not isinstance(doc, dict) or "variant" not in doc:
        raise ContractError(f"{where}: missing key 'variant'")
    extra = sorted(set(doc) - {"variant"})
    if extra:
        raise ContractError(f"{where}: unknown key {extra[0]!r} (a variant file has one key, 'variant')")
    body = doc["variant"]
    if not isinstance(body, dict):
        raise ContractError(f"{where}: key 'variant' must be a mapping, not {type(body).__name__}")
    for key in body:
        if key not in VARIANT_KEYS:
            raise ContractError(f"{where}: unknown key 'variant.{key}' (keys: {', '.join(VARIANT_KEYS)})")
    for key in ("base", "description"):
        if not isinstance(body.get(key), str) or not body[key].strip():
            raise ContractError(f"{where}: key 'variant.{key}' is required and must be a non-empty string")
    variant = Variant(name=name, base=body["base"], description=body["description"].strip(),
                      remove_rules=_check_rules(body.get("remove_rules", []), where),
                      overrides=_check_overrides(body.get("overrides", {}), where), path=where)
    try:
        base = load_contract(variant.base, contracts)
    except ContractError as exc:
        raise ContractError(f"{where}: key 'variant.base' names a contract that cannot be used ({exc})") from None
    try:  # the contract's own checks, reported with the key as the variant file spells it
        contract = validate_contract(variant.apply(base), "@")
    except ContractError as exc:
        raise ContractError(f"{where}: " + str(exc).removeprefix("@: ").replace("key '", "key 'variant.overrides.", 1)) \
            from None
    window = contract["reporting_window"]
    if window["start"] > window["end"]:
        raise ContractError(f"{where}: key 'variant.overrides.reporting_window' starts after it ends "
                            f"({window['start']} > {window['end']})")
    return variant


def load_variant_file(path: str | Path, contracts: str | Path | None = None) -> Variant:
    path = Path(path)
    return parse_variant(read_yaml(path, "variant"), path.stem, str(path), contracts)


def variant_names(contracts: str | Path | None = None) -> list[str]:
    """Every variant file's name: 'full', the per-rule ablation in CATALOGUE order, then the rest by name."""
    rank = {"full": 0, **{f"no-{key}": i + 1 for i, key in enumerate(RULE_KEYS)}}
    names = sorted(p.stem for p in variants_dir(contracts).glob("*.yaml"))
    return sorted(names, key=lambda n: rank.get(n, len(rank)))


def load_variant(name: str, contracts: str | Path | None = None) -> Variant:
    folder = variants_dir(contracts)
    outside = not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\\" in name
    if outside or not (folder / f"{name}.yaml").is_file():
        raise ContractError(f"unknown variant {name!r}; variants in {folder}: {', '.join(variant_names(contracts))}")
    return load_variant_file(folder / f"{name}.yaml", contracts)


def load_variants(names: list[str] | None = None, contracts: str | Path | None = None) -> list[Variant]:
    """The named variants (default: every file), each validated; the first bad one raises."""
    return [load_variant(n, contracts) for n in (variant_names(contracts) if names is None else names)]


VARIANT_AGENTS = ("careful",)


def variant_agent_factory(name: str, contracts: str | Path | None = None):
    """What builds the agent named 'careful@<variant>' (see `careful_factory`)."""
    from .agents.errors import UnknownAgent
    agent_name, _, variant_name = name.partition("@")
    if agent_name not in VARIANT_AGENTS:
        raise UnknownAgent(f"unknown agent {name!r}: only {', '.join(VARIANT_AGENTS)} takes a contract variant "
                           f"('careful@<variant>')")
    try:
        variant = load_variant(variant_name, contracts)
    except ContractError as exc:
        raise UnknownAgent(f"agent {name!r}: {exc}") from None
    return careful_factory(variant)


def careful_factory(variant: Variant):
    """CarefulPandera with the variant's schema changes; its own `without` option adds to the
    variant's removed rules."""
    from .agents.careful import CarefulPandera, rule_keys
    name = f"careful@{variant.name}"

    def careful_under_variant(without=()):
        agent = CarefulPandera(without=rule_keys(without) + tuple(variant.remove_rules),
                               contract_view=variant.apply)
        agent.name = name
        return agent
    return careful_under_variant
