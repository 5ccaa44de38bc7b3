"""The classic bad-batch-gate suite, exactly: eight families, whole batches, seven tools.

Its cases, tools, results, ledger and grades are the classic suite's byte for byte
(`../shared/spec/CONFORMANCE.md`); it is the default suite (a case without a `suite` key).
"""
from __future__ import annotations

from ...kernel.suite import Suite
from . import cases, findings, generator
from .contract import COLUMNS, DEFECT_TYPES, KEY_COLUMNS, validate_contract
from .grader import RUBRIC
from .prompt import SYSTEM_PROMPT
from .rules import CATALOGUE
from .tools import TOOLS, ClassicEpisode
from .world import ClassicPreparedCase

AGENTS = {
    "careful": "gate_pipeline.suites.classic.agents:CarefulPandera",
    "careful-sql": "gate_pipeline.suites.classic.agents:CarefulSQL",
    "profile-only": "gate_pipeline.suites.classic.agents:ProfileOnly",
    "report-liar": "gate_pipeline.suites.classic.attackers:ReportLiar",
    "report-only": "gate_pipeline.suites.classic.attackers:ReportOnly",
    "load-then-quarantine": "gate_pipeline.suites.classic.attackers:LoadThenQuarantine",
    "citation-spray": "gate_pipeline.suites.classic.attackers:CitationSpray",
    "sql-write": "gate_pipeline.suites.classic.attackers:SqlWrite",
    "inspect-theatre": "gate_pipeline.suites.classic.attackers:InspectTheatre",
    "double-load": "gate_pipeline.suites.classic.attackers:DoubleLoad",
    "orders-first": "gate_pipeline.suites.classic.attackers:OrdersFirst",
    "query-farm": "gate_pipeline.suites.classic.attackers:QueryFarm",
}
BASELINES = ("naive", "careful", "careful-sql", "refuse-all", "profile-only")
ATTACKERS = ("report-liar", "report-only", "load-then-quarantine", "citation-spray", "sql-write",
             "inspect-theatre", "double-load", "orders-first")
REWARD_HACKS = ("query-farm",)  # attackers of the shaped rewards; under the rubric alone they are inspect-theatre
# what a contract-schema variant of the classic contract may override, and the type each value must have
OVERRIDES = {
    "limits": {"max_amount": (int, float), "currency": str, "allowed_status": list, "allowed_countries": list},
    "reporting_window": {"start": str, "end": str},
}

SUITE = Suite(
    name="classic",
    description="the classic bad-batch-gate suite: whole batches, seven tools",
    default=True,
    families=generator.FAMILIES,
    columns=COLUMNS,
    defect_types=DEFECT_TYPES,
    key_columns=KEY_COLUMNS,
    references={"orders": ("customers",)},
    tools=TOOLS,
    prepared_case=ClassicPreparedCase,
    episode=ClassicEpisode,
    rubric=RUBRIC,
    case_keys=cases.CASE_KEYS,
    batch_keys=cases.BATCH_KEYS,
    check_case=cases.check_case,
    check_batch=cases.check_batch,
    validate_contract=validate_contract,
    generate=generator.generate,
    findings=findings.findings,
    prompt=SYSTEM_PROMPT,
    agents=AGENTS,
    report_agents=("naive", "careful", "refuse-all"),
    attack_agents=("careful", *ATTACKERS, "profile-only"),
    target="careful",
    rule_keys=tuple(r.key for r in CATALOGUE),
    variant_agent="careful",
    variant_overrides=OVERRIDES,
)
