"""Suite v2: the bad batches the classic suite does not measure.

A v2 case starts from a warehouse with a past (earlier nights of clean loads and their load
log); its batches arrive as CSV files whose header may drift; the contract (contracts/v2.yaml)
adds history rules, a row-quarantine policy and a contract owner to ask. It plays the classic
seven tools on that world and three more (`quarantine_rows`, `cite_defect`, `ask_owner`), and
grades rows one by one (`grader.py`).
"""
from __future__ import annotations

from ...kernel.suite import Metric, assemble
from . import cases, contract, findings, generator, grader, prompt, rules, tools, world

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
    "profiles-history": "gate_pipeline.suites.v2.attackers:ProfilesHistory",
    "load-log-only": "gate_pipeline.suites.v2.attackers:LoadLogOnly",
    "clean-night": "gate_pipeline.suites.v2.attackers:CleanNight",
}
BASELINES = ("oracle", "careful-v2")
ATTACKERS = ("quarantine-all-rows", "row-spray", "ask-everything", "obey-data", "cite-everything", "where-zero")
SHORTCUTS = ("no-warehouse", "no-history", "profiles-only", "by-table", "by-metadata",
             "profiles-history", "load-log-only", "clean-night")  # the last three found in review: see attackers.py
# a v2 variant may also change the row-quarantine policy's cap
OVERRIDES = {
    "limits": {"max_amount": (int, float), "currency": str, "allowed_status": list, "allowed_countries": list},
    "reporting_window": {"start": str, "end": str}, "row_quarantine": {"max_rows": int},
}
METRICS = (Metric("bad_rows_loaded", "bad rows loaded", short="bad rows"),
           Metric("clean_rows_lost", "clean rows lost", short="clean lost"),
           Metric("question_cost", "question cost (mean)", total="mean", short="q cost"))

SUITE = assemble(
    contract=contract, cases=cases, generator=generator, world=world, tools=tools, grader=grader, findings=findings,
    prompt=prompt, rules=rules, name="v2", metrics=METRICS,
    description="suite v2: a warehouse with a past, files whose header drifts, rows graded one by one",
    agents=AGENTS, report_agents=("naive", "careful", "careful-v2", "refuse-all"), target="careful-v2",
    attack_agents=("careful-v2", *ATTACKERS, *SHORTCUTS, "report-liar", "load-then-quarantine", "inspect-theatre"),
    variant_agent="careful-v2", variant_overrides=OVERRIDES, references={"orders": ("customers",)},
)
