"""Suite v2 everywhere gate is: the reward modes, the model's tools and prompt, the gymnasium env,
contract-schema experiments, the nightly job, the HTML page, and cases at real size."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.cases import load_case, read_cases
from gate_pipeline.kernel.engine import play, play_cases, prepare
from gate_pipeline.kernel.suite import suites

ROOT = Path(__file__).resolve().parent.parent
V2_EVAL = ROOT / "cases" / "v2" / "eval_curated.jsonl"
CASES = read_cases(V2_EVAL)
SEVEN = ["read_contract", "list_batches", "profile_batch", "run_sql", "load_batch", "quarantine_batch",
         "submit_report"]


# -- reward modes ---------------------------------------------------------------------------------

def test_potential_shaping_sums_to_the_rubric_minus_a_constant_of_the_case():
    agents = ["careful-v2", "naive", "where-zero", "row-spray", "random"]
    results = play_cases(CASES, agents, reward="potential")
    offsets = defaultdict(set)
    for rs in results.values():
        for r in rs:
            offsets[r.case_id].add(round(r.grade.reward - r.total_reward, 9))
    assert all(len(v) == 1 for v in offsets.values())  # the same constant, whatever the agent
    ranked = sorted(agents, key=lambda a: -sum(r.total_reward for r in results[a]))
    assert ranked == sorted(agents, key=lambda a: -sum(r.grade.reward for r in results[a]))


def test_dense_reward_runs_on_v2_and_its_gold_rows_are_the_labelled_rows():
    from gate_pipeline.suites.v2.contract import KEY_COLUMNS
    for case in CASES:
        gold = prepare(case).gold_rows
        keys = {k for b in case.data["batches"] if b["truth"]["disposition"] == "rows"
                for d in b["truth"]["defects"] for k in d["keys"]}
        gold_keys = {row[0] for row in gold}
        assert keys <= gold_keys, case.case_id
        assert KEY_COLUMNS
    r = play(prepare(CASES[0]), "careful-v2", reward="dense")
    assert r.grade.reward == 1.0 and r.total_reward > r.grade.reward
    decisions = [i for i, e in enumerate(r.ledger) if e["action"] in ("load_batch", "quarantine_rows",
                                                                       "quarantine_batch", "cite_defect")]
    assert all(r.rewards[i] == 0.0 for i in decisions)  # a decision is never shaped: it would leak the label


# -- a model sees its episode's suite ------------------------------------------------------------------

def test_tool_schemas_follow_the_suite():
    from gate_pipeline.model_agent.tool_schemas import tool_schemas
    classic, v2 = tool_schemas(suites.get("classic")), tool_schemas(suites.get("v2"))
    assert [t["function"]["name"] for t in classic] == SEVEN
    assert [t["function"]["name"] for t in v2] == [*SEVEN[:-1], "quarantine_rows", "cite_defect", "ask_owner",
                                                   "submit_report"]
    enum = {t["function"]["name"]: t["function"]["parameters"]["properties"].get("defect_type", {}).get("enum")
            for t in v2}
    assert "schema_drift" in enum["quarantine_rows"] and "schema_drift" not in \
        classic[5]["function"]["parameters"]["properties"]["defect_type"]["enum"]
    rows = next(t for t in v2 if t["function"]["name"] == "quarantine_rows")["function"]["parameters"]
    assert rows["properties"]["keys"]["type"] == "array" and rows["required"] == ["batch_id", "keys", "column",
                                                                                 "defect_type"]


def test_a_model_on_a_v2_case_is_offered_v2s_tools_and_prompt():
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scripted_server import ScriptedServer

    from gate_pipeline.kernel.agents import resolve_agent
    from gate_pipeline.suites.v2.prompt import SYSTEM_PROMPT as SYSTEM_PROMPT_V2
    with ScriptedServer() as server:
        spec = resolve_agent("model", {"model": "scripted", "base_url": server.url})
        result = play(prepare(CASES[0]), spec)
        body = server.last_body
    assert [t["function"]["name"] for t in body["tools"]][6:9] == ["quarantine_rows", "cite_defect", "ask_owner"]
    assert body["messages"][0]["content"] == SYSTEM_PROMPT_V2
    assert result.end_reason == "reported"


def test_the_gym_env_offers_a_v2_case_v2s_tools():
    from gate_pipeline.integrations.gymnasium_env import GateEnv
    env = GateEnv(suite="v2")
    assert all(c.suite == "v2" for c in env.cases) and len(env.cases) == 320
    _, info = env.reset(seed=3)
    assert "ask_owner" in json.loads(info["tools"]) and json.loads(info["tools"])["quarantine_rows"] == ["batch_id", "keys", "column",
                                                                               "defect_type"]
    obs, reward, terminated, truncated, info = env.step('{"tool": "list_batches"}')
    assert not terminated and json.loads(obs["result"])[0]["batch_id"].startswith("B-1008-")
    env.close()
    with pytest.raises(ValueError, match="suite must be one of"):
        GateEnv(suite="v3")


# -- experiments ----------------------------------------------------------------------------------

def test_v2_variants_ablate_v2_rules_and_each_lets_its_family_through():
    from gate_pipeline.experiments import run_experiment
    from gate_pipeline.kernel.variants import load_variants
    names = ["v2-full", "v2-no-orders.amount.unit_shift", "v2-no-orders.header.schema_drift", "v2-no-history",
             "v2-whole-batches"]
    summary, grades = run_experiment(CASES, load_variants(names))
    V = summary["variants"]
    assert V["v2-full"]["reward"] == 1.0 and V["v2-full"]["let_through"] == []
    assert "unit-shift" in V["v2-no-orders.amount.unit_shift"]["let_through"]
    assert V["v2-no-orders.header.schema_drift"]["let_through"] == ["schema-drift"]
    assert {"unit-shift", "volume-anomaly"} <= set(V["v2-no-history"]["let_through"])
    assert V["v2-whole-batches"]["per_family"]["partial-defect"]["reward"] < 1.0  # whole batches refused for rows
    assert list(grades) == [f"careful-v2@{n}" for n in names]


def test_gate_experiment_on_a_v2_file_plays_v2s_variants_and_refuses_a_classic_one(capsys):
    assert main(["experiment", "--cases", str(V2_EVAL), "--variants", "v2-full,v2-no-history"]) == 0
    out = capsys.readouterr().out
    assert "careful-v2 under each contract-schema variant" in out and "v2-no-history" in out
    assert main(["experiment", "--cases", str(V2_EVAL), "--variants", "full"]) == 2
    assert "has base 'classic'" in capsys.readouterr().err
    assert main(["report", "--cases", str(V2_EVAL), "--agents", "careful@v2-full"]) == 2
    assert "its agent is 'careful-v2@v2-full'" in capsys.readouterr().err


# -- the nightly job and the HTML page ------------------------------------------------------------------

def test_gate_nightly_runs_v2_cases(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    small = tmp_path / "v2.jsonl"
    from gate_pipeline.kernel.cases import write_cases
    write_cases(small, CASES[::8])
    assert main(["nightly", "--cases", str(small), "--agents", "careful-v2,naive", "--html",
                 str(tmp_path / "board.html")]) == 0
    out = capsys.readouterr().out
    assert "partial-defect" in out and "question cost (mean)" in out
    page = (tmp_path / "board.html").read_text()
    assert "schema-drift" in page and "instruction-in-data" in page  # CASES[::8]: four families


def test_the_html_page_draws_v2s_families_in_suite_order():
    from gate_pipeline.html_report import render_html
    from gate_pipeline.kernel.suite import family_order
    results = play_cases(CASES[::4], ["careful-v2", "naive"])
    page = render_html({n: [r.grade for r in rs] for n, rs in results.items()})
    from gate_pipeline.suites.v2.generator import FAMILIES
    positions = [page.index(f) for f in FAMILIES]
    assert positions == sorted(positions)
    assert family_order(["ask-the-owner", "clean-control", "partial-defect"]) == [
        "clean-control", "partial-defect", "ask-the-owner"]


# -- real size ------------------------------------------------------------------------------------------

def test_a_case_at_2000_rows_is_solved_as_at_20():
    from gate_pipeline.kernel.contract import load_contract
    from gate_pipeline.suites.v2.generator import EVAL_BASE_SEED, FAMILIES, generate_case
    contract = load_contract("v2")
    for fi in (0, 3):  # partial-defect (rows held back), volume-anomaly (against the past)
        case = generate_case("big", FAMILIES[fi], 1, EVAL_BASE_SEED + 100 * fi + 1, contract, 2000)
        prepared = prepare(load_case(case))
        assert prepared.total_rows > 5 * 2000
        for agent in ("careful-v2", "oracle"):
            assert play(prepared, agent).grade.reward == 1.0, (FAMILIES[fi], agent)
        assert play(prepared, "naive").grade.reward < 1.0
