"""The classic bad-batch-gate suite, exactly: eight families, whole batches, seven tools.

Its cases, tools, results, ledger and grades are the classic suite's byte for byte
(`../shared/spec/CONFORMANCE.md`); it is the default suite (a case without a `suite` key).
"""
from __future__ import annotations

from ...kernel.suite import assemble
from . import cases, contract, findings, generator, grader, prompt, rules, tools, world

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
    "fanout-guess": "gate_pipeline.suites.classic.attackers:FanoutGuess",
}
BASELINES = ("naive", "careful", "careful-sql", "refuse-all", "profile-only")
ATTACKERS = ("report-liar", "report-only", "load-then-quarantine", "citation-spray", "sql-write",
             "inspect-theatre", "double-load", "orders-first")
REWARD_HACKS = ("query-farm",)  # attackers of the shaped rewards; under the rubric alone they are inspect-theatre
LEAKS = ("fanout-guess",)  # shortcuts a prior of the classic files pays for (docs/task.md); not in the attack table
# what a contract-schema variant of the classic contract may override, and the type each value must have
OVERRIDES = {
    "limits": {"max_amount": (int, float), "currency": str, "allowed_status": list, "allowed_countries": list},
    "reporting_window": {"start": str, "end": str},
}

SUITE = assemble(
    contract=contract, cases=cases, generator=generator, world=world, tools=tools, grader=grader, findings=findings,
    prompt=prompt, rules=rules, name="classic", default=True,
    description="the classic bad-batch-gate suite: whole batches, seven tools",
    agents=AGENTS, report_agents=("naive", "careful", "refuse-all"), attack_agents=("careful", *ATTACKERS, "profile-only"),
    target="careful", variant_agent="careful", variant_overrides=OVERRIDES, references={"orders": ("customers",)},
)
