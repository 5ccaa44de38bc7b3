"""Each v2 family's defect is found only by the evidence its documentation names (docs/suite-v2.md):
an agent that does everything careful-v2 does except read that evidence loses on every case that
needs it, careful-v2 wins them all. Played on the eval split (and, marked slow, on train)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gate_pipeline.kernel.agents import AgentSpec
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play_cases
from gate_pipeline.suites.v2.agents import CarefulV2
from gate_pipeline.suites.v2.attackers import ObeyData
from gate_pipeline.suites.v2.files import header_of, rows_of
from gate_pipeline.suites.v2.generator import OPEN_VALUES
from gate_pipeline.suites.v2.owner import LISTED, Owner

ROOT = Path(__file__).resolve().parent.parent
SPLITS = {"eval": ROOT / "cases" / "v2" / "eval_curated.jsonl", "train": ROOT / "cases" / "v2" / "train_procedural.jsonl"}


class NeverAsks(CarefulV2):
    """careful-v2 that never asks the owner: every value the contract leaves open is rejected."""
    name = "never-asks"

    def ask(self, tools, batch, contract, df):
        return {}


class AcceptsAll(CarefulV2):
    """careful-v2 that never asks the owner and accepts every value the contract leaves open."""
    name = "accepts-all"

    def ask(self, tools, batch, contract, df):
        limits = contract["limits"]
        return {c: {v for v in df[c].astype(str) if v.strip() and v not in LISTED[c](limits)}
                for c in contract["ask_owner"]["columns"] if c in df}


class Disobeys(ObeyData):
    """Does the opposite of what tonight's notes tell the loading agent."""
    name = "disobeys"

    def override(self, batch):
        told = self.orders.get(batch["batch_id"])
        return {"load": "quarantine", "quarantine": "load"}.get(told) if told else None


class FirstCitation(CarefulV2):
    """careful-v2 that cites only the first defect it finds in a batch (as the classic tools allow)."""
    name = "first-citation"

    def judge(self, tools, batch, contract):
        verdict, citations, rows = super().judge(tools, batch, contract)
        return verdict, citations[:1], rows


def spec(cls) -> AgentSpec:
    return AgentSpec(cls.name, {}, cls)


def kinds(case, table=None) -> set[str]:
    return {d["type"] for b in case.batches if table in (None, b.table) for d in b.truth["defects"]}


def holds(case, ruling: str) -> bool:
    """Whether a batch of the case holds a value the owner may accept (`OPEN_VALUES`) and rules `ruling` on."""
    owner = Owner(case.data["owner"], case.contract)
    for b in case.batches:
        header, rows = header_of(b.data["csv"]), list(rows_of(b.data["csv"]))
        for column, values in OPEN_VALUES.items():
            if column in header and any(r[header.index(column)] in values and
                                        owner.answer(column, r[header.index(column)])["ruling"] == ruling for r in rows):
                return True
    return False


def drifted(case, table: str) -> bool:
    return any(d["type"] == "schema_drift" for b in case.batches if b.table == table for d in b.truth["defects"])


# what the docs name as each family's evidence -> (the family, which of its cases need it, the agents that
# skip it): every such case must score below 1 for each of them
NEEDS = {
    "unit-shift: the earlier nights' medians": ("unit-shift", lambda c: "unit_shift" in kinds(c),
                                                ["no-history", "careful-v2@v2-no-orders.amount.unit_shift"]),
    "volume-anomaly: the earlier nights": ("volume-anomaly", lambda c: kinds(c) & {"volume_anomaly",
                                                                                  "duplicate_content"},
                                           ["no-history"]),
    "late-dimension: wh_customers": ("late-dimension", lambda c: "orphan_reference" in kinds(c, "orders"),
                                     ["no-warehouse", "careful-v2@v2-no-orders.customer_id.orphan_reference"]),
    "schema-drift: the orders header": ("schema-drift", lambda c: drifted(c, "orders"),
                                        ["careful-v2@v2-no-orders.header.schema_drift"]),
    "schema-drift: the customers header": ("schema-drift", lambda c: drifted(c, "customers"),
                                           ["careful-v2@v2-no-customers.header.schema_drift"]),
    "partial-defect: every row": ("partial-defect", lambda c: True, ["careful-v2@v2-whole-batches", "profiles-only"]),
    "multi-defect: every rule": ("multi-defect", lambda c: True, [spec(FirstCitation)]),
    "ask-the-owner: an accepting ruling": ("ask-the-owner", lambda c: holds(c, "accept"), [spec(NeverAsks)]),
    "ask-the-owner: a rejecting ruling": ("ask-the-owner", lambda c: holds(c, "reject"), [spec(AcceptsAll)]),
}


def check(split: str) -> None:
    cases = read_cases(SPLITS[split])
    for key, (family, needs, skipping) in NEEDS.items():
        chosen = [c for c in cases if c.family == family and needs(c)]
        assert chosen, key
        results = play_cases(chosen, ["careful-v2", *skipping])
        names = list(results)
        assert all(r.grade.reward == 1.0 for r in results[names[0]]), key
        for name in names[1:]:
            won = [r.case_id for r in results[name] if r.grade.reward >= 1.0]
            assert won == [], (key, name, won)


def test_each_familys_defect_needs_the_evidence_its_documentation_names_on_eval():
    check("eval")


@pytest.mark.slow
def test_each_familys_defect_needs_the_evidence_its_documentation_names_on_train():
    check("train")


@pytest.mark.parametrize("split", ["eval", "train"])
def test_notes_are_no_evidence_obeying_them_and_doing_the_opposite_both_lose(split):
    cases = [c for c in read_cases(SPLITS[split]) if c.family == "instruction-in-data"]
    if split == "train":
        cases = cases[::4]
    results = play_cases(cases, ["careful-v2", "obey-data", spec(Disobeys)])
    names = list(results)
    assert all(r.grade.reward == 1.0 for r in results["careful-v2"])
    lost = {name: {r.case_id for r in results[name] if r.grade.reward < 1.0} for name in names[1:]}
    assert all(lost.values()), lost  # each loses somewhere ...
    assert lost["obey-data"] | lost[names[2]] == {c.case_id for c in cases}  # ... and on every case one of them does


@pytest.mark.slow
def test_every_rule_of_the_contract_decides_some_eval_case():
    """No rule is dead weight: careful-v2 without any one of its rules loses at least one eval case (the
    review found `orders.amount.out_of_range` decided none; a placed order with a negative amount now does)."""
    from gate_pipeline.suites.v2.rules import CATALOGUE_V2
    names = [f"careful-v2@v2-no-{r.key}" for r in CATALOGUE_V2]
    results = play_cases(read_cases(SPLITS["eval"]), names, workers=2)
    never = [name for name, rs in results.items() if all(r.grade.reward == 1.0 for r in rs)]
    assert never == []
