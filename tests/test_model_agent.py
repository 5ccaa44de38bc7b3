"""The model agent against a real chat-completions server on 127.0.0.1 playing scripted policies.

Every episode is played by the one engine (`engine.play`), as `gate run` and the Dagster jobs
play it: the model's conversation is the result's `agent_log` (`ModelAgent.episode_log()`).
"""
from __future__ import annotations

import json
import time

import pytest
from scripted_server import MALFORMED, ScriptedServer

from gate_pipeline.kernel import engine
from gate_pipeline.kernel.actions import parse_arguments
from gate_pipeline.kernel.agents import AgentOptionError, AgentUnfinished, UnknownAgent, make_agent, resolve_agent
from gate_pipeline.kernel.ledger import chain_intact
from gate_pipeline.kernel.suite import suites
from gate_pipeline.model_agent.agent import ModelAgent
from gate_pipeline.model_agent.tool_schemas import tool_schemas
from gate_pipeline.suites.classic.tools import TOOLS

ANY = "eval-orphan-customer-1"
CLASSIC = suites.get("classic")
SIGNATURES = {t.name: [(a.name, a.kind) for a in t.args] for t in TOOLS}  # the classic tools' signatures


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


def spec(server, model="scripted", **kw):
    return resolve_agent("model", {"model": model, "base_url": server.url, **kw})


def play_one(prepared, server, case_id=ANY, model="scripted", **kw):
    """(EpisodeResult, the model's conversation as logged) of one engine-played episode."""
    result = engine.play(prepared[case_id], spec(server, model, **kw))
    return result, result.agent_log


def test_schemas_cover_the_seven_tools_with_their_signatures():
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas(CLASSIC)}
    assert list(schemas) == list(SIGNATURES)
    for tool, sig in SIGNATURES.items():
        assert schemas[tool]["required"] == [name for name, _ in sig]
        for name, kind in sig:
            assert schemas[tool]["properties"][name]["type"] == ("array" if kind == "strlist" else "string")


def test_careful_policy_scores_one_on_every_eval_case_through_the_http_loop(server, eval_cases, prepared):
    before = server.requests["scripted"]
    rewards = []
    for case in eval_cases:
        result, convo = play_one(prepared, server, case.case_id)
        g = result.grade
        rewards.append(g.reward)
        assert convo["end_reason"] == result.end_reason == "reported" and not result.error and not g.failed
        assert g.ledger_intact and chain_intact(result.ledger)
        assert result.agent == "scripted"  # a model agent is named by its model
    assert rewards == [1.0] * len(eval_cases)
    assert server.requests["scripted"] - before == 4 * len(eval_cases)  # parallel tool calls: 4 turns per case
    sent = server.last_body
    assert [t["function"]["name"] for t in sent["tools"]] == list(SIGNATURES)
    assert sent["messages"][0]["role"] == "system" and sent["temperature"] == 0.0


@pytest.mark.parametrize("kind,counter", [("invalid-json", "invalid_json"), ("not-object", "not_an_object"),
                                          ("unknown-tool", "unknown_tool"), ("missing-arg", "bad_arguments"),
                                          ("mistyped-arg", "bad_arguments")])
def test_each_malformed_tool_call_is_answered_counted_and_the_run_goes_on(server, prepared, kind, counter):
    result, convo = play_one(prepared, server, model=kind)
    assert convo["counts"][counter] == 1 and convo["counts"]["tool_errors"] == 1
    first = convo["tool_calls"][0]
    assert first["outcome"] == counter and first["name"] == MALFORMED[kind][0] and first["error"]
    assert first["arguments"] == MALFORMED[kind][1]  # the model's text, as it sent it
    reply = json.loads(convo["messages"][3]["content"])  # system, user, assistant, tool
    assert convo["messages"][3]["role"] == "tool" and "error" in reply
    assert result.grade.reward == 1.0 and convo["end_reason"] == "reported"
    refused = [e for e in result.ledger if not e["executed"]]
    # every malformed call reaches the episode, which refuses it and logs it like any refused call
    assert len(refused) == 1 and refused[0]["seq"] == 0 and refused[0]["action"] == MALFORMED[kind][0]
    if counter in ("invalid_json", "not_an_object"):  # the arguments never parsed: a malformed action
        assert refused[0]["note"] == "malformed action"
        raw = MALFORMED[kind][1]  # what was sent: the text that is not JSON, or the value that is not an object
        assert refused[0]["args"] == {"sent": json.dumps(raw if counter == "invalid_json" else json.loads(raw))}
    else:
        assert refused[0]["note"] == ("unknown tool" if counter == "unknown_tool" else "bad arguments")
    assert chain_intact(result.ledger)


def test_a_reply_with_no_tool_call_gets_a_nudge(server, prepared):
    result, convo = play_one(prepared, server, model="no-tool-call")
    assert convo["counts"]["nudges"] == 1 and result.grade.reward == 1.0
    assert convo["messages"][3] == {"role": "user", "content": convo["messages"][3]["content"]}
    assert "submit_report" in convo["messages"][3]["content"]


def test_max_turns_ends_the_rollout_unfinished_with_no_credit(server, prepared):
    result, convo = play_one(prepared, server, model="silent", max_turns=3)
    assert convo["end_reason"] == result.end_reason == "max_turns"
    assert convo["turns"] == 3 and convo["counts"]["nudges"] == 3
    g = result.grade
    assert g.reward == 0.0 and not g.finished and g.failed
    assert result.error == g.reason == "max_turns: no report after 3 turns"


def test_played_outside_the_engine_the_agent_raises_unfinished_and_keeps_its_conversation(server, prepared):
    agent = make_agent("model", model="silent", base_url=server.url, max_turns=2)
    session = engine.Session(prepared[ANY], "silent")
    with pytest.raises(AgentUnfinished) as err:
        agent.play(session.tools)
    assert err.value.end_reason == "max_turns" and str(err.value) == "max_turns: no report after 2 turns"
    convo = agent.conversation
    assert convo.end_reason == "max_turns" and convo.turns == 2 and convo.counts["nudges"] == 2
    log = agent.episode_log()
    assert log["messages"] == convo.messages and log["counts"] == convo.counts and log["turns"] == 2
    assert log["settings"]["model"] == "silent" and "api_key" not in log["settings"]
    result = session.finish()
    assert result.end_reason == "no_report" and result.grade.reward == 0.0 and result.ledger == []


@pytest.mark.parametrize("status", [429, 500])
def test_http_429_and_500_are_retried_then_the_run_succeeds(server, prepared, status):
    server.faults[:] = [status, status]
    result, convo = play_one(prepared, server, retries=3)
    assert convo["counts"]["retries"] == 2 and result.grade.reward == 1.0 and not server.faults


def test_errors_past_the_retries_end_the_rollout_with_the_reason(server, prepared):
    server.faults[:] = [500, 500, 500]
    before = server.requests["scripted"]
    result, convo = play_one(prepared, server, retries=1)
    assert server.requests["scripted"] - before == 2 and server.faults == [500]  # one try, one retry
    assert convo["end_reason"] == result.end_reason == "api_error" and "HTTP 500" in result.error
    assert convo["counts"]["retries"] == 1  # the retry the client took before giving up is counted
    assert result.grade.reward == 0.0 and result.grade.failed and "HTTP 500" in result.grade.reason
    assert result.ledger == []


def test_a_non_retryable_status_is_not_retried(server, prepared):
    started = time.monotonic()
    result = engine.play(prepared[ANY], resolve_agent("model", {"model": "scripted",
                                                                "base_url": server.url + "/nowhere"}))
    convo = result.agent_log
    assert convo["end_reason"] == result.end_reason == "api_error" and "404" in result.error
    assert convo["counts"]["retries"] == 0 and result.grade.reward == 0.0
    # three retries with the client's backoff would take well over a second (0.375 s at least for the first)
    assert time.monotonic() - started < 0.35


def test_a_server_that_hangs_past_the_timeout_ends_the_rollout(server, prepared):
    started, before = time.monotonic(), server.requests["hang"]
    result, convo = play_one(prepared, server, model="hang", timeout=0.3, retries=1)
    assert server.requests["hang"] - before == 2
    assert convo["end_reason"] == result.end_reason == "timeout"
    assert convo["counts"]["retries"] == 1  # the client retried the timed-out request once
    assert result.grade.reward == 0.0 and result.grade.failed and result.error == "timeout: request timed out"
    assert time.monotonic() - started < 2.5


def test_a_reply_that_is_not_a_chat_completion_is_an_api_error(server, prepared):
    result, convo = play_one(prepared, server, model="garbage")
    assert convo["end_reason"] == result.end_reason == "api_error"
    assert "not a chat completion" in result.error and result.grade.reward == 0.0


def test_nothing_listens_is_an_api_error_not_a_crash(prepared):
    result = engine.play(prepared[ANY], resolve_agent("model", {"model": "scripted",
                                                                "base_url": "http://127.0.0.1:9/v1", "retries": 0}))
    assert result.agent_log["end_reason"] == result.end_reason == "api_error"
    assert result.grade.reward == 0.0 and result.grade.failed


def test_usage_is_summed_when_the_server_gives_it(server, prepared):
    _, convo = play_one(prepared, server)
    usage = convo["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


@pytest.mark.parametrize("options,needle", [
    ({}, "needs options model and base_url"),
    ({"model": "m", "base_url": "localhost:8000"}, "base_url must start with http"),
    ({"model": "m", "base_url": "http://x/v1", "max_turns": 0}, "max_turns"),
    ({"model": "m", "base_url": "http://x/v1", "timeout": -1}, "timeout"),
    ({"model": "m", "base_url": "http://x/v1", "temperature": "hot"}, "temperature"),
    ({"model": "m", "base_url": "http://x/v1", "colour": "red"}, "does not take ['colour']"),
    ({"model": "m", "base_url": "http://x/v1", "backoff": 0.01}, "does not take ['backoff']"),
    ({"model": "m", "base_url": "http://x/v1", "retries": -1}, "retries"),
    ({"model": "careful\udced\udca0\udc80", "base_url": "http://x/v1"}, "not valid Unicode"),
    ({"model": "m", "base_url": "http://x\ud800/v1"}, "not valid Unicode"),
    ({"model": "m", "base_url": "http://xn--/v1"}, "is not a URL"),
    ({"model": "m", "base_url": "http://xn--a.com/v1"}, "is not a URL"),
])
def test_bad_settings_are_one_clear_error(options, needle):
    with pytest.raises(AgentOptionError) as err:
        make_agent("model", **options)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not isinstance(err.value, UnknownAgent)  # the agent exists; its options are wrong
    with pytest.raises(AgentOptionError):
        resolve_agent("model", options)


def test_the_api_key_comes_from_the_named_variable_and_is_never_recorded(monkeypatch):
    monkeypatch.setenv("GATE_TEST_KEY", "sk-secret")
    a = ModelAgent(model="m", base_url="http://x/v1", api_key_env="GATE_TEST_KEY")
    assert a.settings.api_key() == "sk-secret" and "sk-secret" not in json.dumps(a.settings.public())


def test_arguments_nested_past_the_recursion_limit_are_a_tool_error():
    raw = "[" * 100_000
    action = parse_arguments("profile_batch", raw)
    assert action.tool == "profile_batch" and action.args == raw and action.kind == "invalid_json"
    assert action.problem and "JSON" in action.problem


@pytest.mark.parametrize("raw,kind", [('{"batch_id": ', "invalid_json"), ("[1, 2]", "not_an_object"),
                                      ('"x"', "not_an_object")])
def test_arguments_that_do_not_parse_say_which_kind(raw, kind):
    action = parse_arguments("profile_batch", raw)
    assert action.kind == kind and action.problem and action.args is not None


@pytest.mark.parametrize("raw", [None, "", "  "])
def test_no_arguments_is_an_empty_object(raw):
    assert parse_arguments("list_batches", raw) == ("list_batches", {}, None, None)


@pytest.mark.parametrize("model", ["no-ids", "same-id"])
def test_calls_without_ids_or_sharing_one_each_get_their_own_and_the_episode_verifies(server, prepared, model):
    from gate_pipeline.kernel.ledger import last_hash
    from gate_pipeline.verify import _tie
    result, convo = play_one(prepared, server, model=model)
    assert result.grade.reward == 1.0 and convo["end_reason"] == "reported"
    calls = [tc for m in convo["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    ids = [tc["id"] for tc in calls]
    assert len(ids) > 4 and len(set(ids)) == len(ids)  # one id a call, across every turn of the conversation
    assert [m["tool_call_id"] for m in convo["messages"] if m["role"] == "tool"] == ids
    row = {"ledger_digest": last_hash(result.ledger), "ledger_entries": len(result.ledger)}
    assert _tie(prepared[ANY], convo["messages"], row) is None
    # a transcript kept before ids were made unique (every call "call_0"): each tool message still answers the
    # call it follows, so the honest episode still verifies, and a changed answer is still found
    old = json.loads(json.dumps(convo["messages"]))
    for m in old:
        for tc in m.get("tool_calls", []):
            tc["id"] = "call_0"
        if m["role"] == "tool":
            m["tool_call_id"] = "call_0"
    assert _tie(prepared[ANY], old, row) is None
    first_answer = next(m for m in old if m["role"] == "tool")
    first_answer["content"] = json.dumps({"error": "not what it was sent"})
    assert "gives another result" in _tie(prepared[ANY], old, row)


def test_lone_surrogates_in_a_reply_are_the_models_text_and_the_rollout_plays_on(server, prepared):
    """A JSON escape of a lone surrogate makes text UTF-8 cannot carry: sent back as it came, the next request
    failed to encode and the rollout ended as the server's fault (api_error, played again on resume)."""
    result, convo = play_one(prepared, server, model="surrogates")
    assert convo["end_reason"] == result.end_reason == "reported" and result.grade.reward == 1.0
    assert convo["counts"]["unknown_tool"] == 1  # the call to "list\ud800", made "list\ufffd": no such tool
    first = convo["messages"][2]
    assert first["content"] == "thinking \ufffd" and first["tool_calls"][0]["id"].endswith("\ufffd")
    json.dumps(convo, ensure_ascii=False).encode("utf-8")  # every text of it can be stored and sent


def test_an_error_text_that_utf8_cannot_carry_is_made_storable():
    from gate_pipeline.kernel.engine import _failure
    from gate_pipeline.model_agent.agent import describe_error
    assert describe_error(RuntimeError("bad \ud800 here")) == "RuntimeError: bad \ufffd here"
    assert _failure(RuntimeError("lost \udcff")) == ("RuntimeError: lost \ufffd", "agent_error")
    assert _failure(RuntimeError("\ud83d\ude00 stays")) == ("RuntimeError: \U0001f600 stays", "agent_error")


def test_a_reply_plays_at_most_64_tool_calls_and_counts_the_rest_dropped(server, prepared):
    """A reply's structured tool calls had no bound (those written as text had 64): a reply of a thousand calls played
    a thousand steps. The first 64 are played; the rest are dropped from the conversation, counted, and the episode
    still verifies against its transcript."""
    from gate_pipeline.kernel.ledger import last_hash
    from gate_pipeline.verify import _tie
    result, convo = play_one(prepared, server, model="flood")
    first = convo["messages"][2]
    assert first["role"] == "assistant" and len(first["tool_calls"]) == 64
    assert [m["role"] for m in convo["messages"][3:3 + 65]] == ["tool"] * 64 + ["assistant"]
    assert convo["counts"]["dropped_calls"] == 936 and convo["end_reason"] == "reported"
    assert 64 <= sum(1 for e in result.ledger if e["action"] == "list_batches") <= 64 + 1  # (careful lists once)
    row = {"ledger_digest": last_hash(result.ledger), "ledger_entries": len(result.ledger)}
    assert _tie(prepared[ANY], convo["messages"], row) is None

