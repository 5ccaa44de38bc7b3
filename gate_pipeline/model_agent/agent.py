"""ModelAgent: a model plays one gate episode through an OpenAI-compatible chat-completions API.

The official `openai.AsyncOpenAI` client, through its public API only: requests go through
`chat.completions.with_raw_response.create` (the reply is read as JSON, so a server that
answers something other than a chat completion is an error the rollout can report), and
retries with backoff on 408/409/429/5xx and connection errors are the client's own
(`max_retries`; `retries_taken` is counted).

Whatever the model sends back, the rollout goes on or ends with a reason. Each tool call goes
to the episode as an action (`tools.act`), so the one action parser reads the model's
arguments: malformed calls (arguments that are not JSON or not an object, an unknown tool,
missing or mistyped arguments) are answered with the tool's error, logged in the ledger like
any refused call, and counted; a reply with no tool call gets a short nudge. With
`text_tool_calls`, a reply whose tool calls came back as text (a server without a tool parser)
has them read by `text_calls.parse_text_calls` and counted apart. An accepted `submit_report`
ends the episode: calls after it in the same reply are refused (as the gymnasium env and `gate
serve` refuse them) and never reach the warehouse. Running out of turns, a request timeout or an
API error ends the episode unfinished (`AgentUnfinished`): no report, no credit.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field

from ..kernel.actions import parse_arguments, tool_call_action
from ..kernel.agents import AgentUnfinished
from ..kernel.cases import bad_text, valid_text
from ..kernel.engine import OVER
from ..kernel.episode import check_args
from ..kernel.errors import GateError
from ..kernel.records import API_ERROR, MAX_TURNS, REPORTED, TIMEOUT
from ..kernel.suite import suites
from .limits import MAX_CALLS_PER_REPLY, MAX_RETRIES
from .prompt import NUDGE, opening_messages
from .text_calls import parse_text_calls
from .tool_schemas import tool_schemas

# replies: answers read from the server; text_tool_calls: the calls of `tool_calls` read from a reply's text;
# after_report: calls after an accepted report in the same reply, refused; dropped_calls: a reply's calls (structured
# or written as text) beyond MAX_CALLS_PER_REPLY, never played nor kept in the conversation
COUNTERS = ("tool_calls", "tool_errors", "invalid_json", "not_an_object", "unknown_tool", "bad_arguments",
            "nudges", "retries", "replies", "text_tool_calls", "after_report", "dropped_calls")
TOOL_CHOICES = ("auto", "required", "none")


class SettingsError(GateError, ValueError):
    """A model setting that cannot work (empty model name, negative timeout...); one line."""


@dataclass(frozen=True)
class ModelSettings:
    model: str
    base_url: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_turns: int = 30
    timeout: float = 60.0
    retries: int = 3
    max_tokens: int | None = None
    tool_choice: str | None = None  # the API's tool_choice: "auto", "required" or "none"; None sends none
    text_tool_calls: bool = False  # read tool calls written as text in a reply that carries none

    def __post_init__(self):
        def bad(msg):
            raise SettingsError(msg)
        if not isinstance(self.model, str) or not self.model.strip():
            bad("model must be a non-empty name")
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            bad(f"base_url must start with http:// or https://, not {self.base_url!r}")
        if not isinstance(self.api_key_env, str) or not self.api_key_env:
            bad("api_key_env must name an environment variable")
        for name in ("model", "base_url", "api_key_env"):  # each is sent, stored and shown: text UTF-8 can carry
            problem = bad_text(getattr(self, name))
            if problem:
                bad(f"{name} {getattr(self, name)[:200]!r} {problem}")
        import httpx  # (the client's own URL type; imported with the client anyway)
        try:  # read as the client reads it: a bad port, bracket or international name is this one line, not the
            url = httpx.URL(self.base_url)  # client's traceback (the host is decoded when first read)
            host, port = url.host, url.port
        except (httpx.InvalidURL, ValueError) as exc:
            bad(f"base_url {self.base_url[:200]!r} is not a URL ({exc})")
        if not host or (port is not None and not 0 < port < 65536):
            bad(f"base_url {self.base_url[:200]!r} needs a host and a port from 1 to 65535")
        for name in ("temperature", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
                bad(f"{name} must be a number >= 0, not {value!r}")
        if self.timeout <= 0 or self.timeout == float("inf"):
            bad(f"timeout must be a finite number of seconds above 0, not {self.timeout!r}")
        if self.temperature > 2:
            bad(f"temperature must be between 0 and 2, not {self.temperature!r}")
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            bad(f"max_turns must be a whole number >= 1, not {self.max_turns!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= MAX_RETRIES:
            bad(f"retries must be a whole number from 0 to {MAX_RETRIES}, not {self.retries!r}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            bad(f"max_tokens must be a whole number >= 1, not {self.max_tokens!r}")
        if self.tool_choice is not None and self.tool_choice not in TOOL_CHOICES:
            bad(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, not {self.tool_choice!r}")
        if not isinstance(self.text_tool_calls, bool):
            bad(f"text_tool_calls must be true or false, not {self.text_tool_calls!r}")

    def api_key(self) -> str:
        """The key from the named variable; local servers (vLLM, llama.cpp, Ollama) accept any, so "EMPTY"."""
        return os.environ.get(self.api_key_env) or "EMPTY"

    def public(self) -> dict:
        """The settings as recorded in transcripts (the variable's name, never the key)."""
        return asdict(self)


SETTING_NAMES = tuple(ModelSettings.__dataclass_fields__)


def make_client(settings: ModelSettings):
    """One async client (its connection pool is shared by every rollout that uses it)."""
    from openai import AsyncOpenAI
    return AsyncOpenAI(base_url=settings.base_url, api_key=settings.api_key(), timeout=settings.timeout,
                       max_retries=settings.retries)


@dataclass
class Conversation:
    """Everything one rollout said and did, as written to the transcript."""
    messages: list = field(default_factory=list)
    tool_calls: list = field(default_factory=list)
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    usage: dict = field(default_factory=dict)
    turns: int = 0
    ids: set = field(default_factory=set)  # the tool call ids the conversation holds (each once)
    end_reason: str = ""
    error: str = ""
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    suite: str = ""  # the episode's suite's name: its tools and its system prompt


class MalformedReply(ValueError):
    """A 200 reply that is not a chat completion (no choices, no message)."""


def _message_of(reply) -> dict:
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
            or not isinstance(choices[0].get("message"), dict):
        raise MalformedReply(f"reply is not a chat completion: {json.dumps(reply, default=str)[:200]}")
    return choices[0]["message"]


def _text(value) -> str:
    """A reply's field as text the conversation can send back (`valid_text`: a lone surrogate, which a JSON
    escape makes and UTF-8 cannot carry, as U+FFFD)."""
    return valid_text(value) if isinstance(value, str) else "" if value is None else json.dumps(value, default=str)


def _unique_id(wanted, fallback: str, ids: set) -> str:
    """The id a tool call goes by in the conversation: the model's, when it gave one no other call of the
    conversation has; else `fallback` (made unique). Each tool message answers its call by that id, and
    `gate verify` ties the two by it, so no two calls may share one (a server that gives none, or one that
    repeats them)."""
    call_id = _text(wanted) if isinstance(wanted, str) and wanted else ""
    if not call_id or call_id in ids:
        call_id, k = fallback, 1
        while call_id in ids:
            call_id, k = f"{fallback}_{k}", k + 1
    ids.add(call_id)
    return call_id


def _assistant_message(message: dict, turn: int, convo: Conversation) -> dict:
    """The assistant turn as it goes back into the conversation: content and well-shaped tool calls (the first
    MAX_CALLS_PER_REPLY; the rest counted dropped), each with an id of its own in the conversation (`_unique_id`)."""
    content = message.get("content")
    content = valid_text(content) if isinstance(content, str) else None
    raw_calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    convo.counts["dropped_calls"] += max(0, len(raw_calls) - MAX_CALLS_PER_REPLY)
    calls = []
    for n, tc in enumerate(raw_calls[:MAX_CALLS_PER_REPLY]):
        tc = tc if isinstance(tc, dict) else {}
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        calls.append({"id": _unique_id(tc.get("id"), f"call_{turn}_{n}", convo.ids), "type": "function",
                      "function": {"name": _text(fn.get("name")), "arguments": _text(fn.get("arguments"))}})
    # content is always text, "" for none (OpenAI allows null beside tool calls; llama.cpp's server does not)
    out: dict = {"role": "assistant", "content": content or ""}
    if calls:
        out["tool_calls"] = calls
    return out


def _with_text_calls(assistant: dict, turn: int, convo: Conversation) -> dict:
    """The assistant turn with the tool calls its text carries made structured (as a server's tool
    parser would have returned them), and the text around them as its content."""
    calls, rest, dropped = parse_text_calls(assistant.get("content"))
    if not calls:
        return assistant
    convo.counts["text_tool_calls"] += len(calls)
    convo.counts["dropped_calls"] += dropped
    return {"role": "assistant", "content": rest or "",
            "tool_calls": [{"id": _unique_id(None, f"text_call_{turn}_{n}", convo.ids), "type": "function",
                            "function": {"name": name, "arguments": arguments}}
                           for n, (name, arguments) in enumerate(calls)]}


def _retried(exc) -> bool:
    """Whether the openai client retries this error (connection errors and timeouts, 408, 409, 429, 5xx)."""
    import openai
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(exc, openai.APIStatusError) and (status in (408, 409, 429) or (status or 0) >= 500)


def describe_error(exc) -> str:
    import openai
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    status = getattr(exc, "status_code", None)
    text = valid_text(" ".join(str(exc).split())[:300])  # a server's words: stored and printed
    if status:
        return f"HTTP {status}: {text}"
    if isinstance(exc, openai.APIConnectionError):  # the innermost cause says why: refused, unresolvable...
        inner, seen = exc, set()
        while (inner.__cause__ or inner.__context__) is not None and id(inner) not in seen:
            seen.add(id(inner))
            inner = inner.__cause__ or inner.__context__
        if inner is not exc and str(inner):
            text = f"{text} ({type(inner).__name__}: {valid_text(' '.join(str(inner).split())[:200])})"
    return f"{type(exc).__name__}: {text}"


def _add_usage(total: dict, usage) -> None:
    if not isinstance(usage, dict):
        return
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


class ModelAgent:
    """The "model" agent: resolve_agent("model", {"model": ..., "base_url": ...}) or any ModelSettings field.

    `client`, when given, is an `AsyncOpenAI` shared with other rollouts (gate run passes one);
    otherwise the agent opens its own for the episode and closes it after."""
    name, oracle = "model", False
    deterministic = False  # a model answers differently from one run to the next: `gate verify` cannot play it again

    def __init__(self, client=None, **settings):
        missing = [k for k in ("model", "base_url") if k not in settings]
        unknown = sorted(set(settings) - set(SETTING_NAMES))
        if missing or unknown:
            raise ValueError("needs options model and base_url" + (f" (missing {missing})" if missing else "")
                             + (f"; it does not take {unknown}" if unknown else "")
                             + f"; options: {', '.join(SETTING_NAMES)}")
        try:
            self.settings = ModelSettings(**settings)
        except SettingsError as exc:
            raise ValueError(str(exc)) from None
        self.client = client
        self.conversation: Conversation | None = None

    @staticmethod
    def identity(options: dict) -> str:
        """A model agent is named by its model, on every surface."""
        model = options.get("model")
        return model if isinstance(model, str) and model.strip() else "model"

    # -- one request -----------------------------------------------------------------------
    async def _complete(self, client, convo: Conversation) -> dict:
        s = self.settings
        extra: dict = {"max_tokens": s.max_tokens} if s.max_tokens else {}
        if s.tool_choice:
            extra["tool_choice"] = s.tool_choice
        started = time.perf_counter()
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=s.model, messages=convo.messages, tools=tool_schemas(suites.get(convo.suite)), temperature=s.temperature, **extra)
        except Exception as exc:
            if _retried(exc):  # the client only gives up on these after all its retries
                convo.counts["retries"] += s.retries
            raise
        finally:
            convo.model_seconds += time.perf_counter() - started
        convo.counts["retries"] += raw.retries_taken
        try:
            return json.loads(raw.content)
        except ValueError as exc:
            raise MalformedReply(f"reply is not JSON ({exc})") from None

    # -- one tool call -----------------------------------------------------------------------
    def _run_tool(self, tools, turn: int, tc: dict, convo: Conversation) -> tuple[object, bool]:
        name, raw = tc["function"]["name"], tc["function"]["arguments"]
        convo.counts["tool_calls"] += 1
        parsed = parse_arguments(name, raw)
        counter = parsed.kind  # "invalid_json" or "not_an_object", when the arguments do not parse
        suite = suites.get(convo.suite)
        if counter is None and name not in suite.tool_names:
            counter = "unknown_tool"
        elif counter is None and check_args(suite, name, parsed.args):
            counter = "bad_arguments"
        started = time.perf_counter()
        result = tools.act(tool_call_action(name, raw, parsed))
        convo.tool_seconds += time.perf_counter() - started
        is_error = isinstance(result, dict) and "error" in result
        if counter:
            convo.counts[counter] += 1
        if is_error:
            convo.counts["tool_errors"] += 1
        record = {"turn": turn, "id": tc["id"], "name": name, "arguments": raw,
                  "outcome": counter or ("tool_error" if is_error else "ok")}
        if is_error:
            record["error"] = result["error"]
        convo.tool_calls.append(record)
        return result, name == "submit_report" and not is_error

    @staticmethod
    def _refuse_after_report(turn: int, tc: dict, convo: Conversation) -> dict:
        convo.counts["after_report"] += 1
        convo.tool_calls.append({"turn": turn, "id": tc["id"], "name": tc["function"]["name"],
                                 "arguments": tc["function"]["arguments"], "outcome": "after_report",
                                 "error": OVER})
        return {"error": OVER}

    # -- the conversation --------------------------------------------------------------------
    async def play_async(self, tools, case=None) -> None:
        """Play one episode; raises AgentUnfinished when it ends without a report."""
        suite = tools.suite
        convo = self.conversation = Conversation(messages=opening_messages(suite), suite=suite.name)
        client = self.client or make_client(self.settings)
        try:
            await self._loop(tools, client, convo)
        finally:
            if self.client is None:
                await client.close()
        if convo.end_reason != REPORTED:
            raise AgentUnfinished(convo.end_reason, f"{convo.end_reason}: {convo.error}")

    async def _loop(self, tools, client, convo: Conversation) -> None:
        import openai
        messages = convo.messages
        for turn in range(1, self.settings.max_turns + 1):
            convo.turns = turn
            try:
                reply = await self._complete(client, convo)
                message = _message_of(reply)
            except openai.APITimeoutError as exc:
                convo.end_reason, convo.error = TIMEOUT, describe_error(exc)
                return
            except Exception as exc:  # API errors, and replies too broken to read
                convo.end_reason, convo.error = API_ERROR, describe_error(exc)
                return
            _add_usage(convo.usage, reply.get("usage"))
            convo.counts["replies"] += 1
            assistant = _assistant_message(message, turn, convo)
            if not assistant.get("tool_calls") and self.settings.text_tool_calls:
                assistant = _with_text_calls(assistant, turn, convo)
            messages.append(assistant)
            if not assistant.get("tool_calls"):
                convo.counts["nudges"] += 1
                messages.append({"role": "user", "content": NUDGE})
                continue
            reported = False
            for tc in assistant["tool_calls"]:
                if reported:  # the episode ended at the report: this call never reaches it
                    result = self._refuse_after_report(turn, tc, convo)
                else:
                    result, reported = self._run_tool(tools, turn, tc, convo)
                messages.append({"role": "tool", "tool_call_id": tc["id"],
                                 "content": json.dumps(result, default=str)})
            if reported:
                convo.end_reason = REPORTED
                return
        convo.end_reason = MAX_TURNS
        convo.error = f"no report after {self.settings.max_turns} turns"

    def play(self, tools, case=None) -> None:
        """The synchronous entry point (the Dagster jobs): the same conversation on an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.play_async(tools, case))
        from concurrent.futures import ThreadPoolExecutor  # called from inside a loop: play on a loop of its own
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self.play_async(tools, case)).result()

    def episode_log(self) -> dict | None:
        """The conversation, for the transcript (`EpisodeResult.agent_log`)."""
        c = self.conversation
        if c is None:
            return None
        return {"settings": self.settings.public(), "turns": c.turns, "end_reason": c.end_reason,
                "counts": c.counts, "usage": c.usage, "model_seconds": round(c.model_seconds, 6),
                "tool_seconds": round(c.tool_seconds, 6), "tool_calls": c.tool_calls, "messages": c.messages}
