"""gate as a verifiers v1 Taskset (verifiers 0.4; 0.3.1 ships the same `verifiers.v1`): the tools served by a real
MCP server in process, called as a harness calls them, and the rollout scored by verifiers' own `Task.score`."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1", reason="no verifiers with verifiers.v1 installed")

import verifiers.v1 as vf  # noqa: E402
from scripted_server import careful  # noqa: E402
from verifiers.v1.graph import MessageNode  # noqa: E402
from verifiers.v1.trace import AgentInfo, Trace, TraceTask  # noqa: E402
from verifiers.v1.types import AssistantMessage, ToolCall, ToolMessage  # noqa: E402

from gate_pipeline.integrations.verifiers_v1 import GateTask, GateTaskset, GateTasksetConfig  # noqa: E402
from gate_pipeline.kernel import engine  # noqa: E402
from gate_pipeline.kernel.pool import CasePool  # noqa: E402
from gate_pipeline.kernel.suite import suites  # noqa: E402
from gate_pipeline.model_agent.tool_schemas import tool_schemas  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT / "cases/classic/eval_curated.jsonl"
V2 = ROOT / "cases/v2/eval_curated.jsonl"


class McpTools:
    """A rollout's tool server on a real MCP server, in process, and a real MCP client to it."""

    def __init__(self, toolset):
        self.toolset = toolset

    async def __aenter__(self):
        try:  # mcp 2 (verifiers 0.4)
            from mcp.client import Client
            from mcp.server.mcpserver import MCPServer
            server = MCPServer("gate")
            self.toolset.register(server)
            self._cm = Client(server)
            self.client = await self._cm.__aenter__()
        except ImportError:  # mcp 1 (verifiers 0.3.1)
            from mcp.server.fastmcp import FastMCP
            from mcp.shared.memory import create_connected_server_and_client_session
            server = FastMCP("gate")
            self.toolset.register(server)
            self._cm = create_connected_server_and_client_session(server)
            self.client = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc):
        await self._cm.__aexit__(*exc)

    async def tools(self) -> dict:
        return {t.name: t for t in (await self.client.list_tools()).tools}

    async def call(self, name: str, arguments: str) -> str:
        """As verifiers' chat loop calls a tool: arguments that are not JSON, or not a JSON object, are answered
        with an error there and never sent."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
        if not isinstance(args, dict):
            return f"error: tool arguments must be a JSON object, got {type(args).__name__}; resend as an object"
        result = await self.client.call_tool(name, args)
        return result.content[0].text


def _trace(task, messages: list) -> Trace:
    return Trace(task=TraceTask(type=type(task).__name__, data=task.data), agent=AgentInfo(config=vf.AgentConfig()),
                 nodes=[MessageNode(message=m, sampled=isinstance(m, AssistantMessage)) for m in messages])


async def play(task, policy, turns: int = 12) -> tuple[Trace, list[dict]]:
    """A harness's loop: the policy's calls go to the MCP tools; returns the trace and the chat messages."""
    toolset = GateTask.toolsets(task.config)[0]
    await toolset.setup_task(task)
    chat: list[dict] = []
    trace_messages: list = []
    async with McpTools(toolset) as tools:
        for _turn in range(turns):
            calls = policy(chat)
            if not calls:
                break
            chat.append({"role": "assistant", "content": None, "tool_calls": calls})
            trace_messages.append(AssistantMessage(tool_calls=[
                ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]) for c in calls]))
            for c in calls:
                text = await tools.call(c["function"]["name"], c["function"]["arguments"])
                chat.append({"role": "tool", "tool_call_id": c["id"], "content": text})
                trace_messages.append(ToolMessage(tool_call_id=c["id"], content=text))
            if any(c["function"]["name"] == "submit_report" for c in calls):
                break
    return _trace(task, trace_messages), chat


def _tasks(**config) -> list:
    return list(GateTaskset(GateTasksetConfig(cases_path=str(EVAL), **config)))


def test_one_task_per_case_keyed_by_case_id():
    tasks = _tasks()
    assert len(tasks) == 32 and [t.key for t in tasks] == [json.loads(line)["case_id"] for line in EVAL.open()]
    t = tasks[0]
    assert t.data.system_prompt == suites.default().prompt and t.data.prompt.startswith("Tonight's batches")
    assert len(_tasks(num_cases=3)) == 3


def test_the_mcp_tools_are_the_suites_with_gate_runs_schemas():
    async def listed():
        async with McpTools(GateTask.toolsets(_tasks()[0].config)[0]) as tools:
            return await tools.tools()
    listed = asyncio.run(listed())
    want = {f["function"]["name"]: f["function"] for f in tool_schemas(suites.default())}
    assert set(listed) == set(want)
    for name, fn in want.items():
        tool = listed[name]
        schema = getattr(tool, "input_schema", None) or tool.inputSchema  # mcp 2 renamed it
        assert set(schema.get("properties", {})) == set(fn["parameters"]["properties"]), name
        assert set(schema.get("required", [])) == set(fn["parameters"]["required"]), name
        assert listed[name].description.startswith(fn["description"])


@pytest.mark.parametrize("index", [0, 9, 21])
def test_a_careful_rollout_scores_the_engines_grade(index):
    task = _tasks()[index]
    trace, _ = asyncio.run(play(task, careful))
    asyncio.run(task.score(trace))
    want = engine.play(CasePool.from_file(EVAL).prepared(task.data.case_id), "careful").grade
    assert trace.rewards["gate_reward"].value == want.reward == 1.0
    assert trace.metrics["disposition"] == 1.0 and trace.metrics["bad_batches_loaded"] == 0.0


def test_no_report_no_credit_and_the_reward_ignores_what_the_tool_results_say():
    task = _tasks()[1]
    listing = []

    def load_all_no_report(chat):
        if not listing:
            listing.append(1)
            return [{"id": "c0", "type": "function", "function": {"name": "list_batches", "arguments": "{}"}}]
        return []
    trace, _ = asyncio.run(play(task, load_all_no_report))
    for node in trace.nodes:  # a tool server that lies: every result claims the report was received
        if isinstance(node.message, ToolMessage):
            node.message = ToolMessage(tool_call_id=node.message.tool_call_id, content='{"status": "received"}')
    asyncio.run(task.score(trace))
    assert trace.rewards["gate_reward"].value == 0.0 and trace.metrics["finished"] == 0.0


def test_calls_after_an_accepted_report_in_the_same_reply_are_refused_by_the_tools_and_the_grade():
    task = _tasks()[3]
    state = {}

    def report_then_load(chat):
        results = {m["tool_call_id"]: m["content"] for m in chat if m["role"] == "tool"}
        if "ids" not in state:
            if "c0" in results:
                state["ids"] = [b["batch_id"] for b in json.loads(results["c0"])]
            else:
                return [{"id": "c0", "type": "function", "function": {"name": "list_batches", "arguments": "{}"}}]
        ids = state["ids"]
        return [{"id": "r", "type": "function", "function": {"name": "submit_report", "arguments": json.dumps(
            {"loaded": ids, "quarantined": []})}}] + [
            {"id": f"l{n}", "type": "function", "function": {"name": "load_batch", "arguments": json.dumps(
                {"batch_id": b})}} for n, b in enumerate(ids)]
    trace, chat = asyncio.run(play(task, report_then_load))
    after = [m["content"] for m in chat if m["role"] == "tool" and m["tool_call_id"].startswith("l")]
    assert after and all("episode is over" in json.loads(text)["error"] for text in after)
    asyncio.run(task.score(trace))
    grade = trace.info["gate_grade"]
    assert grade["finished"] and grade["calls"] == 2  # list_batches and the report: the loads never ran
    assert trace.metrics["bad_batches_loaded"] == 0.0


def _call(call_id: str, tool: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}


def _list_then(ids: list[str], second, third):
    """A policy of three turns: list the batches (their ids put in `ids`), then `second()`'s calls, then `third()`'s."""
    def policy(chat):
        results = {m["tool_call_id"]: m["content"] for m in chat if m["role"] == "tool"}
        if "c0" not in results:
            return [_call("c0", "list_batches", {})]
        if not ids:
            ids.extend(b["batch_id"] for b in json.loads(results["c0"]))
            return second()
        return third()
    return policy


def test_a_call_with_an_argument_its_tool_does_not_take_is_graded_as_it_ran():
    """The MCP server hands a tool only the arguments it declares, so a load sent with another one loads, and it
    reads a list sent as JSON text, so such a report is received; the graded replay plays the same calls, not
    ones the engine refuses (they ran live, and the episode was graded unloaded and unreported)."""
    task = _tasks()[1]  # a clean control: loading every batch is right
    ids: list[str] = []
    load_with_extras = _list_then(ids, lambda: [_call(f"l{n}", "load_batch", {"batch_id": b, "why": "it looked fine",
                                                                              "force": True}) for n, b in enumerate(ids)],
                                  lambda: [_call("r", "submit_report", {"loaded": json.dumps(ids), "quarantined": "[]",
                                                                         "note": "x"})])  # lists as JSON text
    trace, chat = asyncio.run(play(task, load_with_extras))
    assert json.loads(next(m["content"] for m in chat if m.get("tool_call_id") == "r"))["status"] == "received"
    loads = [json.loads(m["content"]) for m in chat if m["role"] == "tool" and m["tool_call_id"].startswith("l")]
    assert len(loads) >= 2 and all(r.get("status") == "loaded" for r in loads), loads  # live: every load ran
    asyncio.run(task.score(trace))
    grade = trace.info["gate_grade"]
    assert grade["disposition"] == 1.0 and grade["revenue_error_usd"] == 0.0 and grade["finished"], grade
    assert grade["calls"] == len(loads) + 2


def test_a_v2_case_file_needs_the_v2_suites_tools():
    with pytest.raises(ValueError, match="set task.suite"):
        list(GateTaskset(GateTasksetConfig(cases_path=str(V2))))
    tasks = list(GateTaskset(GateTasksetConfig(cases_path=str(V2), task={"suite": "v2"}, num_cases=1)))
    names = {fn.__name__ for fn in __import__("verifiers.v1.utils.decorators", fromlist=["_"]).discover_decorated(
        GateTask.toolsets(tasks[0].config)[0], "tool")}
    assert names == set(suites.get("v2").tool_names)


def test_the_taskset_id_is_the_package_name():
    """`vf-eval gate-pipeline` on the v1 stack: verifiers imports `gate_pipeline` and takes the Taskset `__all__`
    names; importing gate alone imports no verifiers (tests/test_architecture.py)."""
    from verifiers.v1.utils.loaders import load_taskset, taskset_class
    assert taskset_class("gate-pipeline") is GateTaskset
    taskset = load_taskset(GateTasksetConfig(id="gate-pipeline", num_cases=2))
    assert [t.key for t in taskset] == ["eval-clean-control-0", "eval-clean-control-1"]


def test_calls_in_prompt_supplied_assistant_messages_are_not_the_models():
    """An assistant message the model never generated (context in the prompt) carries no call the reward replays."""
    task = _tasks()[0]
    trace, _ = asyncio.run(play(task, careful))
    forged = AssistantMessage(tool_calls=[ToolCall(id="f", name="load_batch", arguments='{"batch_id": "B-0930-60-1"}')])
    trace.nodes.insert(0, MessageNode(message=forged, sampled=False))
    asyncio.run(task.score(trace))
    assert trace.rewards["gate_reward"].value == 1.0 and trace.info["gate_grade"]["calls"] == len(
        [c for m in trace.assistant_messages for c in m.tool_calls or []])


def test_a_call_the_tool_server_refuses_is_not_in_the_graded_replay():
    """A load whose batch id is a number, a report whose list is no list, or a tool the suite has not, is refused by
    the MCP server before any tool runs, and arguments that are not a JSON object never leave verifiers' chat loop
    (the model gets the error, the episode sees nothing); the graded replay leaves such calls out rather than play
    them to the engine, which would keep each in the ledger as refused (and count it towards `max_steps`)."""
    task = _tasks()[1]  # a clean control: loading every batch is right
    ids: list[str] = []
    refused_then_right = _list_then(
        ids, lambda: [_call("x0", "load_batch", {"batch_id": 7}), _call("x2", "drop_table", {"name": "x"}),
                      *({"id": f"x{3 + k}", "type": "function", "function": {"name": "list_batches", "arguments": text}}
                        for k, text in enumerate(["not json", "null", "[]", "   "])),
                      *(_call(f"l{n}", "load_batch", {"batch_id": b}) for n, b in enumerate(ids))],
        lambda: [_call("x1", "submit_report", {"loaded": "not a list", "quarantined": [], "note": "x"}),
                 _call("r", "submit_report", {"loaded": ids, "quarantined": [], "note": "x"})])
    trace, chat = asyncio.run(play(task, refused_then_right))
    refused = [m["content"] for m in chat if m["role"] == "tool" and m["tool_call_id"].startswith("x")]
    assert len(refused) == 7 and all("status" not in text for text in refused), refused  # neither ran live
    asyncio.run(task.score(trace))
    grade = trace.info["gate_grade"]
    assert grade["disposition"] == 1.0 and grade["finished"], grade
    assert grade["calls"] == len(ids) + 2  # list_batches, the loads, the report: not the seven refused


def test_arguments_the_library_cannot_read_are_a_refused_call_not_a_crash():
    """JSON text nested past the decoder's depth makes the MCP library raise a RecursionError, which the server
    answers as the tool's error: the replay leaves the call out (`handed` gives None) rather than fail the score."""
    from gate_pipeline.integrations.verifiers_v1 import handed
    for text in ("[" * 100_000 + "]" * 100_000, '{"a": ' * 5_000 + "1" + "}" * 5_000, "not JSON", '["a", 1]'):
        assert handed("classic", "submit_report", {"loaded": text, "quarantined": []}) is None
    assert handed("classic", "submit_report", {"loaded": '["a"]', "quarantined": [], "why": "x"}) == {
        "loaded": ["a"], "quarantined": []}
