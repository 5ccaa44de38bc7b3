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

The base contract names the suite (`kernel.contract.suite_of_contract_file`), and the suite says
what a variant of its contract changes: the careful agent it applies to (`Suite.variant_agent`:
`careful@<variant>` for the classic contract, `careful-v2@<variant>` for v2's), the rule keys
`remove_rules` may name (`Suite.rule_keys`) and the values `overrides` may replace
(`Suite.variant_overrides`).
"""
from __future__ import annotations

import copy
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from .contract import SHIPPED_CONTRACTS, ContractError, load_contract, read_yaml, suite_of_contract_file
from .errors import UnknownAgent
from .files import path_state
from .suite import Suite, suites

VARIANT_KEYS = ("base", "description", "remove_rules", "overrides")
_BASE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")  # a contract's file name without .yaml
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def suite_of_base(base: str) -> Suite:
    """The suite whose contract a variant's base is (by the base contract's name)."""
    return suite_of_contract_file(f"{base}.yaml")


@dataclass(frozen=True)
class Variant:
    name: str
    base: str
    description: str
    remove_rules: tuple[str, ...] = ()
    overrides: dict = field(default_factory=dict)
    path: str = ""

    @property
    def suite(self) -> Suite:
        return suite_of_base(self.base)

    @property
    def agent(self) -> str:
        """The agent this variant changes: its suite's careful agent."""
        return self.suite.variant_agent

    def apply(self, contract: dict) -> dict:
        """The contract the schema is built from: `contract` with this variant's overrides. A section the
        contract does not have is left out (a v2 variant's row-quarantine policy applied to a classic
        contract, which has none, adds none: careful-v2 on a classic case stays classic)."""
        out = copy.deepcopy(contract)
        for section, values in self.overrides.items():
            if section in out:
                out[section] = {**out[section], **copy.deepcopy(values)}
        return out


def variants_dir(contracts: str | Path | None = None) -> Path:
    """`variants/` in the contracts directory (default: the shipped contracts)."""
    return Path(contracts or SHIPPED_CONTRACTS) / "variants"


def _type_name(kind) -> str:
    return kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)


def _check_overrides(overrides, where: str, allowed) -> dict:
    if not isinstance(overrides, dict):
        raise ContractError(f"{where}: key 'variant.overrides' must be a mapping, not {type(overrides).__name__}")
    for section, values in overrides.items():
        if section not in allowed:
            raise ContractError(f"{where}: key 'variant.overrides.{section}' cannot be overridden "
                                f"(only {', '.join(allowed)})")
        if not isinstance(values, dict):
            raise ContractError(f"{where}: key 'variant.overrides.{section}' must be a mapping, "
                                f"not {type(values).__name__}")
        for key, value in values.items():
            kind = allowed[section].get(key)
            if kind is None:
                raise ContractError(f"{where}: key 'variant.overrides.{section}.{key}' cannot be overridden "
                                    f"(only {', '.join(allowed[section])})")
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ContractError(f"{where}: key 'variant.overrides.{section}.{key}' must be a "
                                    f"{_type_name(kind)}, not {type(value).__name__}")
            if kind is list and not (value and all(isinstance(v, str) and v for v in value)):
                raise ContractError(f"{where}: key 'variant.overrides.{section}.{key}' must be a non-empty "
                                    f"list of strings")
    return overrides


def _check_rules(rules, where: str, known: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ContractError(f"{where}: key 'variant.remove_rules' must be a list of rule keys")
    for rule in rules:
        if rule not in known:
            raise ContractError(f"{where}: key 'variant.remove_rules' names unknown rule {rule!r}; "
                                f"rules: {', '.join(known)}")
    return tuple(rules)


def parse_variant(doc, name: str, where: str, contracts: str | Path | None = None) -> Variant:
    """Check one variant document; return the Variant or raise ContractError naming `where` and the key."""
    if not NAME_RE.match(name):
        raise ContractError(f"{where}: variant name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    if not isinstance(doc, dict) or "variant" not in doc:
        raise ContractError(f"{where}: missing key 'variant'")
    extra = sorted(str(k) for k in set(doc) - {"variant"})  # YAML keys may be numbers, dates, ...
    if extra:
        raise ContractError(f"{where}: unknown key {extra[0][:80]!r} (a variant file has one key, 'variant')")
    body = doc["variant"]
    if not isinstance(body, dict):
        raise ContractError(f"{where}: key 'variant' must be a mapping, not {type(body).__name__}")
    for key in body:
        if key not in VARIANT_KEYS:
            raise ContractError(f"{where}: unknown key 'variant.{key}' (keys: {', '.join(VARIANT_KEYS)})")
    for key in ("base", "description"):
        if not isinstance(body.get(key), str) or not body[key].strip():
            raise ContractError(f"{where}: key 'variant.{key}' is required and must be a non-empty string")
    if not _BASE_NAME.fullmatch(body["base"]):  # a name in the contracts folder, never a path (one outside it, or a
        raise ContractError(f"{where}: key 'variant.base' must name a contract in the contracts folder (letters, "
                            f"digits, '.', '_', '-'), not {body['base'][:80]!r}")  # NUL that failed the open)
    suite = suite_of_base(body["base"])
    if not suite.variant_agent:
        raise ContractError(f"{where}: key 'variant.base': suite {suite.name!r} has no agent a variant applies to")
    variant = Variant(name=name, base=body["base"], description=body["description"].strip(),
                      remove_rules=_check_rules(body.get("remove_rules", []), where, suite.rule_keys),
                      overrides=_check_overrides(body.get("overrides", {}), where, suite.variant_overrides), path=where)
    try:
        base = load_contract(variant.base, contracts)
    except ContractError as exc:
        raise ContractError(f"{where}: key 'variant.base' names a contract that cannot be used ({exc})") from None
    try:  # the contract's own checks, reported with the key as the variant file spells it
        suite.validate_contract(variant.apply(base), "@")
    except ContractError as exc:
        raise ContractError(f"{where}: " + str(exc).removeprefix("@: ").replace("key '", "key 'variant.overrides.", 1)) \
            from None
    return variant


def load_variant_file(path: str | Path, contracts: str | Path | None = None) -> Variant:
    path = Path(path)
    return parse_variant(read_yaml(path, "variant"), path.stem, str(path), contracts)


def variant_names(contracts: str | Path | None = None) -> list[str]:
    """Every variant file's name, suite by suite (the default suite's unprefixed, the others' prefixed with
    the suite's name): '<prefix>full', then the per-rule ablation '<prefix>no-<rule>' in its suite's rule
    order; then the rest by name. Not hidden files (no name loads them); an entry that is no regular file is
    listed, so that loading every variant says what it is rather than leaving it out."""
    rank: dict[str, int] = {}
    for suite in suites.all():
        prefix = "" if suite.default else f"{suite.name}-"
        for name in (f"{prefix}full", *(f"{prefix}no-{key}" for key in suite.rule_keys)):
            rank.setdefault(name, len(rank))
    names = sorted(p.stem for p in variants_dir(contracts).glob("*.yaml") if not p.name.startswith("."))
    return sorted(names, key=lambda n: rank.get(n, len(rank)))


def load_variant(name: str, contracts: str | Path | None = None) -> Variant:
    folder = variants_dir(contracts)
    outside = not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\\" in name
    state = "missing" if outside else path_state(folder / f"{name}.yaml")
    if state == "missing":
        raise ContractError(f"unknown variant {name!r}; variants in {folder}: {', '.join(variant_names(contracts))}")
    if state != "file":  # listed (its name ends .yaml), but no file to read: said so, not "unknown" and listed
        raise ContractError(f"{folder / f'{name}.yaml'}: is {'a directory' if state == 'directory' else 'no regular file'}"
                            f", not a variant file")
    return load_variant_file(folder / f"{name}.yaml", contracts)


def load_variants(names: list[str] | None = None, contracts: str | Path | None = None) -> list[Variant]:
    """The named variants (default: every file), each validated; the first bad one raises."""
    return [load_variant(n, contracts) for n in (variant_names(contracts) if names is None else names)]


def variants_of_suite(suite: Suite, variants: list[Variant]) -> list[Variant]:
    """The variants whose base is of `suite` (a case file's experiment plays only those)."""
    return [v for v in variants if v.suite is suite]


def variant_agents() -> list[str]:
    """The agents a contract-schema variant applies to (each suite's careful agent)."""
    return [s.variant_agent for s in suites.all() if s.variant_agent]


def variant_agent_name(variant: Variant) -> str:
    return f"{variant.agent}@{variant.name}"


def variant_agent_factory(name: str, contracts: str | Path | None = None):
    """What builds the agent named '<agent>@<variant>' (see `careful_factory`)."""
    agent_name, _, variant_name = name.partition("@")
    accepted = variant_agents()
    if agent_name not in accepted:
        raise UnknownAgent(f"unknown agent {name!r}: only {', '.join(accepted)} take a contract variant "
                           f"({', '.join(f'{a}@<variant>' for a in accepted)})")
    try:
        variant = load_variant(variant_name, contracts)
    except ContractError as exc:
        raise UnknownAgent(f"agent {name!r}: {exc}") from None
    if agent_name != variant.agent:
        raise UnknownAgent(f"agent {name!r}: variant {variant.name!r} has base {variant.base!r}; "
                           f"its agent is {variant_agent_name(variant)!r}")
    return careful_factory(variant)


def careful_factory(variant: Variant):
    """The variant's suite's careful agent with the variant's schema changes; its own `without` option
    (a list of rule keys) adds to the variant's removed rules."""
    name = variant_agent_name(variant)
    target = variant.suite.agents[variant.agent]
    module, _, attr = target.partition(":")
    agent_class = getattr(importlib.import_module(module), attr)

    def careful_under_variant(without=()):
        if isinstance(without, str) or not isinstance(without, (list, tuple)):
            raise ValueError(f"option 'without' must be a list of rule keys, not {without!r}")
        agent = agent_class(without=tuple(without) + tuple(variant.remove_rules), contract_view=variant.apply)
        agent.name = name
        return agent
    return careful_under_variant
