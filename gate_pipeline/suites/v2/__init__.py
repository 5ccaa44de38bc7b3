"""Suite v2: the bad batches the classic suite does not measure.

A v2 case starts from a warehouse with a past (earlier nights of clean loads and their load
log); its batches arrive as CSV files whose header may drift; the contract (contracts/v2.yaml)
adds history rules, a row-quarantine policy and a contract owner to ask. It plays the classic
seven tools on that world and three more (`quarantine_rows`, `cite_defect`, `ask_owner`), and
grades rows one by one (`grader.py`).
"""
from __future__ import annotations

from ...kernel.suite import Metric, Suite
from . import cases, findings, generator
from .contract import COLUMNS_V2, DEFECT_TYPES_V2, KEY_COLUMNS, validate_contract
from .grader import RUBRIC
from .prompt import SYSTEM_PROMPT
from .rules import RULE_KEYS_V2
from .tools import TOOLS, EpisodeV2
from .world import PreparedCaseV2

AGENTS = {
    "oracle": "gate_pipeline.suites.v2.agents:Oracle",
    "careful-v2": "gate_pipeline.suites.v2.agents:CarefulV2",
    "quarantine-all-rows": "gate_pipeline.suites.v2.attackers:QuarantineAllRows",
    "row-spray": "gate_pipeline.suites.v2.attackers:RowSpray",
    "ask-everything": "gate_pipeline.suites.v2.attackers:AskEverything",
    "obey-data": "gate_pipeline.suites.v2.attackers:ObeyData",
    "cite-everything": "gate_pipeline.suites.v2.attackers:CiteEverything",
    "where-zero": "gate_pipeline.suites.v2.attackers:WhereZero",
    "no-warehouse": "gate_pipeline.suites.v2.attackers:NoWarehouse",
    "no-history": "gate_pipeline.suites.v2.attackers:NoHistory",
    "profiles-only": "gate_pipeline.suites.v2.attackers:ProfilesOnly",
    "by-table": "gate_pipeline.suites.v2.attackers:ByTable",
    "by-metadata": "gate_pipeline.suites.v2.attackers:ByMetadata",
}
BASELINES = ("oracle", "careful-v2")
ATTACKERS = ("quarantine-all-rows", "row-spray", "ask-everything", "obey-data", "cite-everything", "where-zero")
SHORTCUTS = ("no-warehouse", "no-history", "profiles-only", "by-table", "by-metadata")
OVERRIDES = {
    "limits": {"max_amount": (int, float), "currency": str, "allowed_status": list, "allowed_countries": list},
    "reporting_window": {"start": str, "end": str},
    "row_quarantine": {"max_rows": int},
}

SUITE = Suite(
    name="v2",
    description="suite v2: a warehouse with a past, files whose header drifts, rows graded one by one",
    families=generator.FAMILIES,
    columns=COLUMNS_V2,
    defect_types=DEFECT_TYPES_V2,
    key_columns=KEY_COLUMNS,
    references={"orders": ("customers",)},
    tools=TOOLS,
    prepared_case=PreparedCaseV2,
    episode=EpisodeV2,
    rubric=RUBRIC,
    case_keys=cases.CASE_KEYS,
    batch_keys=cases.BATCH_KEYS,
    check_case=cases.check_case,
    check_batch=cases.check_batch,
    check_rest=cases.check_rest,
    validate_contract=validate_contract,
    generate=generator.generate,
    findings=findings.findings,
    prompt=SYSTEM_PROMPT,
    agents=AGENTS,
    report_agents=("naive", "careful", "careful-v2", "refuse-all"),
    attack_agents=("careful-v2", *ATTACKERS, *SHORTCUTS, "report-liar", "load-then-quarantine", "inspect-theatre"),
    target="careful-v2",
    rows=(generator.MIN_ROWS, generator.MAX_ROWS, generator.DEFAULT_ROWS),
    rule_keys=RULE_KEYS_V2,
    variant_agent="careful-v2",
    variant_overrides=OVERRIDES,
    metrics=(Metric("bad_rows_loaded", "bad rows loaded", short="bad rows"),
             Metric("clean_rows_lost", "clean rows lost", short="clean lost"),
             Metric("question_cost", "question cost (mean)", total="mean", short="q cost")),
)
