"""The model agent against a real chat-completions server on 127.0.0.1 playing scripted policies."""
from __future__ import annotations

import json
import time

import pytest

from gate_pipeline.agents import UnknownAgent, make_agent
from gate_pipeline.ledger import chain_intact
from gate_pipeline.model_agent.agent import ModelAgent
from gate_pipeline.model_agent.tool_schemas import tool_schemas
from gate_pipeline.runner import play
from gate_pipeline.tools import SIGNATURES
from scripted_server import MALFORMED, ScriptedServer

ANY = "eval-orphan-customer-1"


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(hang_seconds=3.0) as s:
        yield s


@pytest.fixture(autouse=True)
def _clean(server):
    server.faults.clear()
    server.delay = 0.0
    yield
    server.faults.clear()


def agent(server, model="careful", **kw):
    return make_agent("model", model=model, base_url=server.url, backoff=0.01, **kw)


def play_one(prepared, server, case_id=ANY, model="careful", **kw):
    a = agent(server, model, **kw)
    g, episode = play(prepared[case_id], a, keep_episode=True)
    entries = episode.ledger.entries
    episode.close()
    return g, a.last, entries


def test_schemas_cover_the_seven_tools_with_their_signatures():
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas()}
    assert list(schemas) == list(SIGNATURES)
    for tool, sig in SIGNATURES.items():
        assert schemas[tool]["required"] == [name for name, _ in sig]
        for name, kind in sig:
            assert schemas[tool]["properties"][name]["type"] == ("array" if kind == "strlist" else "string")


def test_careful_policy_scores_one_on_every_eval_case_through_the_http_loop(server, eval_cases, prepared):
    before = server.requests["careful"]
    rewards = []
    for case in eval_cases:
        g, convo, entries = play_one(prepared, server, case["case_id"])
        rewards.append(g["reward"])
        assert convo.end_reason == "reported" and g["ledger_intact"] and chain_intact(entries)
    assert rewards == [1.0] * len(eval_cases)
    assert server.requests["careful"] - before == 4 * len(eval_cases)  # parallel tool calls: 4 turns per case
    sent = server.last_body
    assert [t["function"]["name"] for t in sent["tools"]] == list(SIGNATURES)
    assert sent["messages"][0]["role"] == "system" and sent["temperature"] == 0.0


@pytest.mark.parametrize("kind,counter", [("invalid-json", "invalid_json"), ("not-object", "not_an_object"),
                                          ("unknown-tool", "unknown_tool"), ("missing-arg", "bad_arguments"),
                                          ("mistyped-arg", "bad_arguments")])
def test_each_malformed_tool_call_is_answered_counted_and_the_run_goes_on(server, prepared, kind, counter):
    g, convo, entries = play_one(prepared, server, model=kind)
    assert convo.counts[counter] == 1 and convo.counts["tool_errors"] == 1
    first = convo.tool_calls[0]
    assert first["outcome"] == counter and first["name"] == MALFORMED[kind][0] and first["error"]
    reply = json.loads(convo.messages[3]["content"])  # system, user, assistant, tool
    assert convo.messages[3]["role"] == "tool" and "error" in reply
    assert g["reward"] == 1.0 and convo.end_reason == "reported"
    refused = [e for e in entries if not e["executed"]]
    if counter in ("invalid_json", "not_an_object"):
        assert refused == []  # never reached the episode: nothing to log
    else:  # reached the episode, which refused and logged it
        assert len(refused) == 1 and refused[0]["action"] == MALFORMED[kind][0]


def test_a_reply_with_no_tool_call_gets_a_nudge(server, prepared):
    g, convo, _ = play_one(prepared, server, model="no-tool-call")
    assert convo.counts["nudges"] == 1 and g["reward"] == 1.0
    assert convo.messages[3] == {"role": "user", "content": convo.messages[3]["content"]}
    assert "submit_report" in convo.messages[3]["content"]


def test_max_turns_ends_the_rollout_unfinished_with_no_credit(server, prepared):
    g, convo, _ = play_one(prepared, server, model="silent", max_turns=3)
    assert convo.end_reason == "max_turns" and convo.turns == 3 and convo.counts["nudges"] == 3
    assert g["reward"] == 0.0 and not g["finished"] and g["error"] == "RolloutUnfinished: max_turns: no report after 3 turns"


@pytest.mark.parametrize("status", [429, 500])
def test_http_429_and_500_are_retried_then_the_run_succeeds(server, prepared, status):
    server.faults[:] = [status, status]
    g, convo, _ = play_one(prepared, server, retries=3)
    assert convo.counts["retries"] == 2 and g["reward"] == 1.0 and not server.faults


def test_errors_past_the_retries_end_the_rollout_with_the_reason(server, prepared):
    server.faults[:] = [500, 500, 500]
    g, convo, entries = play_one(prepared, server, retries=1)
    assert convo.end_reason == "api_error" and "HTTP 500" in convo.error and convo.counts["retries"] == 1
    assert g["reward"] == 0.0 and entries == []


def test_a_non_retryable_status_is_not_retried(server, prepared):
    a = make_agent("model", model="careful", base_url=server.url + "/nowhere", backoff=0.01)
    g = play(prepared[ANY], a)
    assert a.last.end_reason == "api_error" and "404" in a.last.error and a.last.counts["retries"] == 0
    assert g["reward"] == 0.0


def test_a_server_that_hangs_past_the_timeout_ends_the_rollout(server, prepared):
    started = time.monotonic()
    g, convo, _ = play_one(prepared, server, model="hang", timeout=0.3, retries=1)
    assert convo.end_reason == "timeout" and convo.error == "request timed out" and convo.counts["retries"] == 1
    assert g["reward"] == 0.0 and time.monotonic() - started < 2.5


def test_a_reply_that_is_not_a_chat_completion_is_an_api_error(server, prepared):
    g, convo, _ = play_one(prepared, server, model="garbage")
    assert convo.end_reason == "api_error" and "not a chat completion" in convo.error and g["reward"] == 0.0


def test_nothing_listens_is_an_api_error_not_a_crash(prepared):
    a = make_agent("model", model="careful", base_url="http://127.0.0.1:9/v1", retries=0)
    g = play(prepared[ANY], a)
    assert a.last.end_reason == "api_error" and g["reward"] == 0.0


def test_usage_is_summed_when_the_server_gives_it(server, prepared):
    _, convo, _ = play_one(prepared, server)
    assert convo.usage["total_tokens"] == convo.usage["prompt_tokens"] + convo.usage["completion_tokens"] > 0


@pytest.mark.parametrize("options,needle", [
    ({}, "needs options model and base_url"),
    ({"model": "m", "base_url": "localhost:8000"}, "base_url must start with http"),
    ({"model": "m", "base_url": "http://x/v1", "max_turns": 0}, "max_turns"),
    ({"model": "m", "base_url": "http://x/v1", "timeout": -1}, "timeout"),
    ({"model": "m", "base_url": "http://x/v1", "temperature": "hot"}, "temperature"),
    ({"model": "m", "base_url": "http://x/v1", "colour": "red"}, "does not take ['colour']"),
])
def test_bad_settings_are_one_clear_error(options, needle):
    with pytest.raises(UnknownAgent, match=None) as err:
        make_agent("model", **options)
    assert needle in str(err.value)


def test_the_api_key_comes_from_the_named_variable_and_is_never_recorded(monkeypatch):
    monkeypatch.setenv("GATE_TEST_KEY", "sk-secret")
    a = ModelAgent(model="m", base_url="http://x/v1", api_key_env="GATE_TEST_KEY")
    assert a.settings.api_key() == "sk-secret" and "sk-secret" not in json.dumps(a.settings.public())


def test_arguments_nested_past_the_recursion_limit_are_a_tool_error():
    from gate_pipeline.model_agent.agent import _parse_arguments
    args, counter, error = _parse_arguments("[" * 100_000)
    assert args is None and counter == "invalid_json" and "not valid JSON" in error
