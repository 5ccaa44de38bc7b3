"""gate's TRL environment_factory, driven as TRL's GRPOTrainer drives one (trl 1.16, trainer/grpo_trainer.py):
it probes an instance for `reset`, `get_reward` and the public functions of its class, renders each function's
schema with transformers' `get_json_schema`, calls `reset(**row)` with the dataset row, calls the tools with the
model's parsed arguments (an exception becomes {"error": ...}), and scores with `get_reward()`."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from scripted_server import careful, load_all

from gate_pipeline.integrations.trl_env import GateTRLEnv, trl_dataset, trl_environment
from gate_pipeline.kernel import engine
from gate_pipeline.kernel.pool import CasePool
from gate_pipeline.kernel.suite import suites
from gate_pipeline.model_agent.tool_schemas import tool_schemas

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT / "cases/classic/eval_curated.jsonl"
V2 = ROOT / "cases/v2/eval_curated.jsonl"


@pytest.fixture(scope="module")
def factory():
    return trl_environment(cases=EVAL)


def probe(factory):
    """GRPOTrainer.__init__: one instance, its reset, its get_reward, its tools (public functions of the class)."""
    instance = factory()
    has_reset = has_reward = False
    methods = []
    for member_name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction):
        if member_name == "reset":
            has_reset = True
        elif member_name == "get_reward":
            has_reward = True
        elif not member_name.startswith("_"):
            methods.append(getattr(instance, member_name))
    return instance, has_reset, has_reward, methods


def rollout(environment, row: dict, policy, max_iterations: int = 30) -> list[dict]:
    """_generate_and_score_completions + _tool_call_loop for one rollout: reset(**row), then the policy's tool calls
    with parsed arguments, each result as a tool message (str(result)), until the policy stops calling tools."""
    observation = environment.reset(**row)
    assert observation is None  # the row brings the prompt
    tools = {name: getattr(environment, name) for name, _ in inspect.getmembers(type(environment), inspect.isfunction)
             if name not in ("reset", "get_reward") and not name.startswith("_")}
    messages: list[dict] = []
    for _ in range(max_iterations):
        calls = policy(messages)
        if not calls:
            break
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        for call in calls:
            function = call["function"]
            try:
                result = tools[function["name"]](**json.loads(function["arguments"]))
            except Exception as e:  # as TRL does
                result = {"error": str(e)}
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": function["name"],
                             "content": str(result)})
        if any(c["function"]["name"] == "submit_report" for c in calls):
            break
    return messages


def test_trl_finds_reset_get_reward_and_the_suites_tools(factory):
    instance, has_reset, has_reward, methods = probe(factory)
    assert has_reset and has_reward
    assert sorted(m.__name__ for m in methods) == sorted(suites.default().tool_names)
    assert isinstance(instance, GateTRLEnv)


def test_the_tool_schemas_trl_renders_are_gate_runs(factory):
    get_json_schema = pytest.importorskip("transformers.utils").get_json_schema
    _, _, _, methods = probe(factory)
    want = {f["function"]["name"]: f["function"] for f in tool_schemas(suites.default())}
    for method in methods:
        got = get_json_schema(method)["function"]
        fn = want[got["name"]]
        assert got["description"] == fn["description"]
        props = fn["parameters"]["properties"]
        assert set(got["parameters"]["properties"]) == set(props)
        assert set(got["parameters"].get("required", [])) == set(fn["parameters"]["required"])
        for name, schema in got["parameters"]["properties"].items():
            assert schema["type"] == props[name]["type"] and schema["description"] == props[name]["description"]
            assert schema.get("enum") == props[name].get("enum")  # defect_type lists the suite's defect types


@pytest.mark.parametrize("policy,agent", [(careful, "careful"), (load_all, "naive")])
def test_a_rollout_scores_the_engines_grade(factory, policy, agent):
    dataset = trl_dataset(factory.pool)
    assert dataset.column_names == ["prompt", "case_id", "family", "suite"] and len(dataset) == 32
    pool = CasePool.from_file(EVAL)
    environment = factory()
    for index in (0, 5, 17, 30):  # one instance, reset between rollouts, as TRL pools them
        row = dataset[index]
        if policy is load_all:
            listing = []

            def policy_(messages, listing=listing):  # list first, then load everything and report
                if not listing:
                    listing.append(1)
                    return [{"id": "l", "type": "function", "function": {"name": "list_batches", "arguments": "{}"}}]
                return load_all(messages)
            rollout(environment, row, policy_)
        else:
            rollout(environment, row, policy)
        want = engine.play(pool.prepared(row["case_id"]), agent).grade
        assert environment.get_reward() == want.reward
        assert environment.grade["case_id"] == row["case_id"] and environment.grade["finished"]


def test_calls_after_the_report_are_refused_and_an_open_episode_grades_zero(factory):
    environment = factory()
    environment.reset(case_id="eval-amount-bounds-0", prompt=[])
    assert "no report" not in environment.read_contract()
    listing = json.loads(environment.list_batches())
    ids = [b["batch_id"] for b in listing]
    assert json.loads(environment.submit_report(loaded=ids, quarantined=[])) == {"status": "received"}
    after = json.loads(environment.load_batch(batch_id=ids[0]))
    assert "episode is over" in after["error"]
    assert environment.get_reward() == engine.replay(CasePool.from_file(EVAL).prepared("eval-amount-bounds-0"), [
        {"tool": "read_contract"}, {"tool": "list_batches"},
        {"tool": "submit_report", "args": {"loaded": ids, "quarantined": []}}])[1].grade.reward
    environment.reset(case_id="eval-amount-bounds-0")
    environment.list_batches()
    assert environment.get_reward() == 0.0 and not environment.grade["finished"]  # no report, no credit


def test_bad_arguments_and_bad_rows_never_raise_out_of_a_tool(factory):
    environment = factory()
    with pytest.raises(ValueError, match="case_id"):
        environment.reset(case_id="no-such-case")
    with pytest.raises(ValueError, match="case_id"):
        environment.reset(prompt="x")
    assert "reset" in json.loads(environment.list_batches())["error"]
    environment.reset(case_id="eval-clean-control-0")
    for result in (environment.load_batch(batch="B-1"), environment.load_batch(batch_id=7),
                   environment.profile_batch(), environment.run_sql(query="DROP TABLE wh_orders"),
                   environment.submit_report(loaded="B-1", quarantined=None), environment.load_batch("a", "b"),
                   environment.quarantine_batch(batch_id="B-0930-60-1", column="amount", defect_type="nope"),
                   environment.profile_batch(**{"self": "x", "batch_id": "B-1"})):
        assert "error" in json.loads(result)
    assert json.loads(environment.read_contract())  # the episode goes on
    # a call with an argument named "self" reaches the episode, refused in its ledger like any other (it was a
    # TypeError, raised before the episode saw it)
    refused = environment.session.episode.world.ledger.entries[-2]
    assert refused["action"] == "profile_batch" and not refused["executed"] and "self" in json.dumps(refused["args"])
    text = trl_environment(cases=EVAL)().reset(case_id="eval-clean-control-0")  # no prompt in the row
    assert text.startswith(suites.default().prompt[:40]) and text.endswith("Begin.")


def test_v2_cases_get_the_v2_tools_and_shaped_modes_return_the_episodes_return():
    v2 = trl_environment(cases=V2)
    assert sorted(m.__name__ for m in probe(v2)[3]) == sorted(suites.get("v2").tool_names)
    dense = trl_environment(cases=EVAL, reward="dense")()
    dense.reset(case_id="eval-clean-control-0")
    dense.list_batches()
    dense.run_sql(query="SELECT 1")
    assert dense.get_reward() == pytest.approx(dense.session.result.total_reward) and dense.get_reward() != 0.0
    with pytest.raises(ValueError, match="reward"):
        trl_environment(cases=EVAL, reward="shaped")
