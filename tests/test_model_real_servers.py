"""What `gate run` needs from real servers, against the scripted server: the endpoint check through GET /models (and
its one-token fallback), --tool-choice, tool calls written as text, the no-tool-call warning, tools.json, and calls
after an accepted report refused."""
from __future__ import annotations

import asyncio
import json

import pytest
from scripted_server import ScriptedServer

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.suite import suites
from gate_pipeline.model_agent.agent import ModelSettings, make_client
from gate_pipeline.model_agent.rollouts import preflight, read_transcripts
from gate_pipeline.model_agent.text_calls import parse_text_calls
from gate_pipeline.model_agent.tool_schemas import tool_schemas


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s



def run(server, tmp_path, model, *extra):
    return main(["run", "--model", model, "--base-url", server.url, "--runs-dir", str(tmp_path), *extra])


def lines(tmp_path, run_id):
    return read_transcripts(tmp_path / run_id / "transcripts.jsonl")


def check(server, **settings):
    async def go():
        s = ModelSettings(model="scripted", base_url=server.url, **settings)
        client = make_client(s)
        try:
            return await preflight(client, s)
        finally:
            await client.close()
    return asyncio.run(go())


# -- the endpoint check ----------------------------------------------------------------------------

def test_the_check_asks_get_models_and_sends_no_completion(server):
    before, probes = sum(server.requests.values()), server.probes
    assert check(server) == "models"
    assert sum(server.requests.values()) == before and server.probes == probes


def test_without_a_models_route_the_check_asks_for_one_token(server):
    server.models_route = False
    try:
        probes = server.probes
        assert check(server) == "chat/completions"
        assert server.probes == probes + 1 and server.last_body["max_tokens"] == 1
    finally:
        server.models_route = True


def test_a_run_starts_on_a_server_without_the_models_route(server, tmp_path, capsys):
    server.models_route = False
    try:
        assert run(server, tmp_path, "scripted", "-n", "2", "--run-id", "nomodels", "--json") == 0
    finally:
        server.models_route = True
    assert json.loads(capsys.readouterr().out)["summary"]["agents"]["scripted"]["reward"] == 1.0


# -- --tool-choice -----------------------------------------------------------------------------------

def test_tool_choice_is_sent_and_required_makes_a_lazy_model_call_tools(server, tmp_path, capsys):
    assert run(server, tmp_path, "lazy", "-n", "2", "--max-turns", "3", "--run-id", "lazy", "--json") == 0
    err = capsys.readouterr().err
    assert "tool_choice" not in server.last_body  # not given: not sent
    assert "gate: warning: none of the model's 6 replies carried a tool call" in err
    assert "--tool-choice required or --text-tool-calls" in err
    assert run(server, tmp_path, "lazy", "-n", "2", "--tool-choice", "required", "--run-id", "lazy-req",
               "--json") == 0
    out, err = capsys.readouterr()
    assert server.last_body["tool_choice"] == "required" and "warning" not in err
    assert json.loads(out)["summary"]["agents"]["lazy"]["reward"] == 1.0


def test_tool_choice_none_and_the_one_line_warning(server, tmp_path, capsys):
    assert run(server, tmp_path, "scripted", "-n", "1", "--max-turns", "2", "--tool-choice", "none",
               "--run-id", "none") == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if line.startswith("gate: warning:")]
    assert len(warnings) == 1 and "none of the model's 2 replies carried a tool call" in warnings[0]
    assert "--tool-choice required" in warnings[0]


def test_a_bad_tool_choice_is_one_line(server, tmp_path, capsys):
    assert run(server, tmp_path, "scripted", "--tool-choice", "always") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tool-choice" in err and "always" in err


def test_resuming_with_another_tool_choice_or_text_parsing_is_refused(server, tmp_path, capsys):
    assert run(server, tmp_path, "scripted", "-n", "1", "--run-id", "bind") == 0
    capsys.readouterr()
    assert run(server, tmp_path, "scripted", "-n", "1", "--run-id", "bind", "--tool-choice", "required") == 2
    assert "tool_choice=None, not 'required'" in capsys.readouterr().err
    assert run(server, tmp_path, "scripted", "-n", "1", "--run-id", "bind", "--text-tool-calls") == 2
    assert "text_tool_calls=False, not True" in capsys.readouterr().err


# -- tool calls written as text ----------------------------------------------------------------------

@pytest.mark.parametrize("model", ["hermes-text", "json-text"])
def test_text_tool_calls_are_opt_in_and_counted_apart(server, tmp_path, capsys, model):
    assert run(server, tmp_path, model, "-n", "3", "--max-turns", "2", "--run-id", f"{model}-off", "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["summary"]["agents"][model]["reward"] == 0.0  # not asked to read them: nudged
    assert "--text-tool-calls" in err
    assert run(server, tmp_path, model, "-n", "3", "--max-turns", "40", "--text-tool-calls", "--run-id", model) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err
    assert "reward (mean)                 1.0000" in out
    counts = [line["counts"] for line in lines(tmp_path, model)]
    assert all(c["text_tool_calls"] == c["tool_calls"] > 0 and c["nudges"] == 0 for c in counts)
    total = sum(c["text_tool_calls"] for c in counts)
    assert f"of the tool calls: written as text {total}, after an accepted report (refused) 0" in out
    first = lines(tmp_path, model)[0]["messages"][2]
    assert first["role"] == "assistant" and first["tool_calls"][0]["id"].startswith("text_call_1_")
    assert "<tool_call>" not in first["content"]


def test_text_calls_in_the_common_shapes_and_hostile_text():
    calls, rest, _ = parse_text_calls('Checking.\n<tool_call>\n{"name": "list_batches", "arguments": {}}\n</tool_call>\n'
                                   '<tool_call>{"name": "profile_batch", "arguments": {"batch_id": "B-1"}}</tool_call>')
    assert calls == [("list_batches", "{}"), ("profile_batch", '{"batch_id": "B-1"}')] and rest == "Checking."
    assert parse_text_calls('{"name": "run_sql", "parameters": {"query": "SELECT 1"}}') == (
        [("run_sql", '{"query": "SELECT 1"}')], None, 0)
    assert parse_text_calls('```json\n{"name": "read_contract"}\n```') == ([("read_contract", "")], None, 0)
    assert parse_text_calls('{"name": "load_batch", "arguments": "{\\"batch_id\\": \\"B\\"}"}')[0] == [
        ("load_batch", '{"batch_id": "B"}')]
    # a <tool_call> block that is not JSON is a call with invalid arguments (answered), never dropped
    calls, _, _ = parse_text_calls('<tool_call>{"name": "load_batch", "arguments": {"batch_id": </tool_call>')
    assert calls[0][0] == "load_batch" and calls[0][1].startswith('{"name"')
    for text in ("All fine.", '{"answer": 42}', "[1, 2]", "{" * 100_000, "", None, 7, "<tool_call>" * 10_000,
                 '{"name": ""}', '{"name": 5}', "x" * 300_000):
        calls, _, _ = parse_text_calls(text)
        assert all(isinstance(n, str) and isinstance(a, str) for n, a in calls)
    calls, _, dropped = parse_text_calls("<tool_call>{}</tool_call>" * 1000)
    assert len(calls) == 64 and dropped == 936  # at most MAX_CALLS_PER_REPLY a reply, the rest counted


def test_a_reply_that_opens_a_fence_and_runs_on_whitespace_is_read_in_the_time_of_its_length():
    # a degenerate generation: a fence opened, then whitespace to the limit; the fence was matched by a pattern
    # whose lazy body tried every split of the whitespace (20,000 newlines: 9 s; 199,000: about 16 minutes)
    import time
    for fill in (" ", "\n", "\t"):
        started = time.perf_counter()
        for reply in ("```json\n" + fill * 199_000 + "x", "```" + fill * 199_000 + "```x", "```json" + fill * 199_990):
            assert parse_text_calls(reply) == ([], reply, 0)
        assert time.perf_counter() - started < 5  # the old pattern: hundreds of seconds for each
    # what a fence holds is still read, whatever its language tag and the space around it
    assert parse_text_calls('```\n{"name": "read_contract"}```') == ([("read_contract", "")], None, 0)
    assert parse_text_calls('  ```tool_code  \n\n {"name": "list_batches"} \n```  ') == ([("list_batches", "")], None, 0)
    assert parse_text_calls('```json{"name": "read_contract"}```') == ([("read_contract", "")], None, 0)
    assert parse_text_calls("``````")[0] == [] and parse_text_calls("`````")[0] == []


def test_a_broken_text_call_is_answered_as_invalid_json_and_the_run_goes_on(server, tmp_path, prepared):
    from gate_pipeline.kernel import engine
    from gate_pipeline.model_agent.agent import Conversation, ModelAgent, _with_text_calls
    convo = Conversation(suite=suites.default().name)
    msg = _with_text_calls({"role": "assistant", "content": '<tool_call>{"name": "list_batches", </tool_call>'}, 1,
                           convo)
    assert convo.counts["text_tool_calls"] == 1 and msg["tool_calls"][0]["function"]["name"] == "list_batches"
    agent = ModelAgent(model="scripted", base_url=server.url)
    session = engine.Session(prepared["eval-clean-control-0"], "t")
    result, ok = agent._run_tool(session.tools, 1, msg["tool_calls"][0], convo)
    assert "error" in result and not ok and convo.counts["invalid_json"] == 1
    session.finish()


# -- the report ends the episode ----------------------------------------------------------------------

def test_calls_after_an_accepted_report_in_the_same_reply_are_refused(server, tmp_path, capsys, home):
    assert run(server, tmp_path, "report-then-load", "-n", "4", "--run-id", "rtl") == 0
    out = capsys.readouterr().out
    for line in lines(tmp_path, "rtl"):
        refused = [c for c in line["tool_calls"] if c["outcome"] == "after_report"]
        assert refused and all(c["name"] == "load_batch" and "episode is over" in c["error"] for c in refused)
        assert [e["action"] for e in line["ledger"]] == ["list_batches", "submit_report"]  # no load ran
        assert line["counts"]["after_report"] == len(refused)
        assert line["grade"]["bad_batches_loaded"] == 0
        tool_replies = [m for m in line["messages"] if m["role"] == "tool"]
        assert len(tool_replies) == len(line["tool_calls"])  # every call id answered, as the API requires
    assert "after an accepted report (refused) " in out
    assert main(["verify", "--run", str(tmp_path / "rtl")]) == 0


# -- tools.json -----------------------------------------------------------------------------------

def test_the_tools_schema_is_recorded_in_the_run_directory(server, tmp_path, capsys):
    assert run(server, tmp_path, "scripted", "-n", "1", "--run-id", "schema") == 0
    doc = json.loads((tmp_path / "schema" / "tools.json").read_text())
    suite = suites.default()
    assert doc == {suite.name: {"system_prompt": suite.prompt, "tools": tool_schemas(suite)}}
    assert server.last_body["tools"] == doc[suite.name]["tools"]  # what was sent
