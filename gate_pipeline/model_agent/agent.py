"""ModelAgent: a model plays one gate episode through an OpenAI-compatible chat-completions API.

Whatever the model sends back, the rollout goes on or ends with a reason; it never raises
out of `converse`. Malformed tool calls (arguments that are not JSON or not an object, an
unknown tool, missing or mistyped arguments) are answered with a tool error, a reply with no
tool call with a short nudge, and each is counted. Running out of turns, a request timeout or
an API error (after retries with backoff) ends the rollout unfinished: no report, no credit.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..tools import SIGNATURES, check_args
from .prompt import NUDGE, opening_messages
from .tool_schemas import tool_schemas

# end reasons of a rollout; only "reported" is finished
REPORTED, MAX_TURNS, TIMEOUT, API_ERROR = "reported", "max_turns", "timeout", "api_error"
RETRYABLE_STATUS = (408, 409, 429)
COUNTERS = ("tool_calls", "tool_errors", "invalid_json", "not_an_object", "unknown_tool", "bad_arguments",
            "nudges", "retries")

Call = Callable[[str, dict], object]  # (tool, args) -> the JSON value the tool returns

# json.dumps(value, default=str), with one encoder instead of one built per call (~3 us each,
# and a rollout encodes every message and tool result)
to_json = json.JSONEncoder(default=str).encode


class SettingsError(ValueError):
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
    backoff: float = 0.5        # first retry waits about this long, doubling after each
    backoff_max: float = 8.0
    max_tokens: int | None = None

    def __post_init__(self):
        def bad(msg):
            raise SettingsError(msg)
        if not isinstance(self.model, str) or not self.model.strip():
            bad("model must be a non-empty name")
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            bad(f"base_url must start with http:// or https://, not {self.base_url!r}")
        if not isinstance(self.api_key_env, str) or not self.api_key_env:
            bad("api_key_env must name an environment variable")
        for name, low in (("temperature", 0.0), ("timeout", 0.0), ("backoff", 0.0), ("backoff_max", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or value != value:
                bad(f"{name} must be a number >= {low:g}, not {value!r}")
        if self.timeout <= 0:
            bad("timeout must be more than 0 seconds")
        if self.temperature > 2:
            bad(f"temperature must be between 0 and 2, not {self.temperature!r}")
        for name, low in (("max_turns", 1), ("retries", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                bad(f"{name} must be a whole number >= {low}, not {value!r}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            bad(f"max_tokens must be a whole number >= 1, not {self.max_tokens!r}")

    def api_key(self) -> str:
        """The key from the named variable; local servers (vLLM, llama.cpp, Ollama) accept any, so "EMPTY"."""
        return os.environ.get(self.api_key_env) or "EMPTY"

    def public(self) -> dict:
        """The settings as recorded in transcripts (the variable's name, never the key)."""
        return asdict(self)


@dataclass
class Conversation:
    """Everything one rollout said and did, as written to the transcript."""
    messages: list = field(default_factory=list)
    tool_calls: list = field(default_factory=list)
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    usage: dict = field(default_factory=dict)
    turns: int = 0
    end_reason: str = ""
    error: str = ""
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    encoded: list = field(default_factory=list, repr=False)  # messages as sent, JSON-encoded once

    @property
    def finished(self) -> bool:
        return self.end_reason == REPORTED


def make_client(settings: ModelSettings):
    """One async client (keep-alive connection pool) for many rollouts; retries are ours, so 0 here."""
    from openai import DefaultAsyncHttpxClient

    from .client import GateOpenAI
    http_client = None
    if settings.base_url.startswith("http://"):
        from .transport import KeepAliveTransport
        http_client = DefaultAsyncHttpxClient(transport=KeepAliveTransport(), timeout=settings.timeout)
    return GateOpenAI(base_url=settings.base_url, api_key=settings.api_key(), timeout=settings.timeout,
                       max_retries=0, http_client=http_client)


def _retryable(exc) -> bool:
    import openai
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(exc, openai.APIStatusError) and (status in RETRYABLE_STATUS or (status or 0) >= 500)


def _retry_after(exc) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _describe(exc) -> str:
    import openai
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    status = getattr(exc, "status_code", None)
    text = " ".join(str(exc).split())[:300]
    return f"HTTP {status}: {text}" if status else f"{type(exc).__name__}: {text}"


def _add_usage(total: dict, usage) -> None:
    if not isinstance(usage, dict):
        return
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


class MalformedReply(ValueError):
    """A 200 reply that is not a chat completion (no choices, no message)."""


def _message_of(reply) -> dict:
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
            or not isinstance(choices[0].get("message"), dict):
        raise MalformedReply(f"reply is not a chat completion: {json.dumps(reply, default=str)[:200]}")
    return choices[0]["message"]


def _text(value) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value, default=str)


def _assistant_message(message: dict) -> dict:
    """The assistant turn as it goes back into the conversation: content and well-shaped tool calls."""
    content = message.get("content")
    out: dict = {"role": "assistant", "content": content if isinstance(content, str) else None}
    raw_calls = message.get("tool_calls")
    calls = []
    for n, tc in enumerate(raw_calls if isinstance(raw_calls, list) else []):
        tc = tc if isinstance(tc, dict) else {}
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        call_id = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else f"call_{n}"
        calls.append({"id": call_id, "type": "function",
                      "function": {"name": _text(fn.get("name")), "arguments": _text(fn.get("arguments"))}})
    if calls:
        out["tool_calls"] = calls
    return out


def _parse_arguments(raw) -> tuple[dict | None, str | None, str | None]:
    """(args, counter, error): the arguments object, or what is wrong with them."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None, None  # "no arguments" is how many servers send a zero-argument call
    try:
        args = json.loads(raw)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested past Python's limit
        return None, "invalid_json", f"arguments are not valid JSON ({exc}); send one JSON object"
    if not isinstance(args, dict):
        return None, "not_an_object", f"arguments must be a JSON object, not {type(args).__name__}"
    return args, None, None


class ModelAgent:
    """The "model" agent: settings as keyword options (make_agent("model", model=..., base_url=...))."""
    name, oracle = "model", False

    def __init__(self, **settings):
        from ..agents import UnknownAgent  # the error make_agent's callers (CLI, Dagster) already handle
        missing = [k for k in ("model", "base_url") if k not in settings]
        unknown = sorted(set(settings) - set(ModelSettings.__dataclass_fields__))
        if missing or unknown:
            raise UnknownAgent(f"agent 'model' needs options model and base_url"
                               + (f" (missing {missing})" if missing else "")
                               + (f"; it does not take {unknown}" if unknown else ""))
        try:
            self.settings = ModelSettings(**settings)
        except SettingsError as exc:
            raise UnknownAgent(f"agent 'model': {exc}") from None
        self.last: Conversation | None = None
        self._tools = tool_schemas()
        s = self.settings
        fixed = {"model": s.model, "tools": self._tools, "temperature": s.temperature}
        if s.max_tokens:
            fixed["max_tokens"] = s.max_tokens
        self._head = json.dumps(fixed)[:-1] + ', "messages": ['

    # -- one request, with retries ---------------------------------------------------------
    async def _complete(self, client, messages: list, convo: Conversation) -> dict:
        """The reply as JSON. Sent as raw bytes through the client's `post` (GateOpenAI's
        `post_bytes`: the same request path; same auth, errors and timeouts as
        chat.completions.create) because the typed path re-walks every message of a growing
        conversation on each turn, which was most of the client's CPU per request."""
        import httpx2
        s = self.settings
        # the conversation only grows: encode each message once, not once per turn
        encoded = convo.encoded
        encoded.extend(map(to_json, messages[len(encoded):]))
        content = (self._head + ",".join(encoded) + "]}").encode()
        options = {"headers": {"Content-Type": "application/json"}, "timeout": s.timeout}
        post_bytes = getattr(client, "post_bytes", None)
        for attempt in range(s.retries + 1):
            started = time.perf_counter()
            try:
                if post_bytes is not None:  # GateOpenAI: the same post, options copied not rebuilt
                    response = await post_bytes("/chat/completions", content, options)
                else:
                    response = await client.post("/chat/completions", cast_to=httpx2.Response, content=content,
                                                 options=options)
                return json.loads(response.content)
            except Exception as exc:
                if attempt == s.retries or not _retryable(exc):
                    raise
                convo.counts["retries"] += 1
                wait = min(s.backoff_max, s.backoff * 2 ** attempt) * (0.5 + random.random() / 2)
                hinted = _retry_after(exc)
                await asyncio.sleep(min(s.backoff_max, hinted) if hinted is not None else wait)
            finally:
                convo.model_seconds += time.perf_counter() - started

    # -- one tool call -----------------------------------------------------------------------
    def _run_tool(self, call: Call, turn: int, tc: dict, convo: Conversation) -> tuple[object, bool]:
        name, raw = tc["function"]["name"], tc["function"]["arguments"]
        convo.counts["tool_calls"] += 1
        args, counter, error = _parse_arguments(raw)
        if counter is None and name not in SIGNATURES:
            counter = "unknown_tool"
        elif counter is None and check_args(name, args):
            counter = "bad_arguments"
        if args is not None:  # the episode answers (and logs) everything that parsed, even refusals
            started = time.perf_counter()
            try:
                result = call(name, args)
            except Exception as exc:  # the tool layer should never raise; if it does, the model hears it
                result = {"error": f"tool failed: {type(exc).__name__}: {exc}"}
            convo.tool_seconds += time.perf_counter() - started
        else:
            result = {"error": error}
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

    # -- the conversation --------------------------------------------------------------------
    async def converse(self, call: Call, client=None) -> Conversation:
        """Play one episode through `call(tool, args)`; never raises for anything the server does."""
        own_client = client is None
        client = make_client(self.settings) if own_client else client
        convo = Conversation(messages=opening_messages())
        try:
            await self._loop(call, client, convo)
        finally:
            if own_client:
                await client.close()
        self.last = convo
        return convo

    async def _loop(self, call: Call, client, convo: Conversation) -> None:
        import openai
        messages = convo.messages
        for turn in range(1, self.settings.max_turns + 1):
            convo.turns = turn
            try:
                reply = await self._complete(client, messages, convo)
                message = _message_of(reply)
            except openai.APITimeoutError as exc:
                convo.end_reason, convo.error = TIMEOUT, _describe(exc)
                return
            except Exception as exc:  # API errors, and replies too broken to read
                convo.end_reason, convo.error = API_ERROR, _describe(exc)
                return
            _add_usage(convo.usage, reply.get("usage"))
            assistant = _assistant_message(message)
            messages.append(assistant)
            if not assistant.get("tool_calls"):
                convo.counts["nudges"] += 1
                messages.append({"role": "user", "content": NUDGE})
                continue
            reported = False
            for tc in assistant["tool_calls"]:
                result, ok_report = self._run_tool(call, turn, tc, convo)
                reported = reported or ok_report
                messages.append({"role": "tool", "tool_call_id": tc["id"],
                                 "content": to_json(result)})
            if reported:
                convo.end_reason = REPORTED
                return
        convo.end_reason = MAX_TURNS
        convo.error = f"no report after {self.settings.max_turns} turns"

    # -- the Agent protocol ------------------------------------------------------------------
    def play(self, tools, case=None) -> None:
        """Sync entry point (runner.play, the Dagster pipeline). An unfinished rollout raises
        RolloutUnfinished after the episode is left as it stands, so the grade records why."""
        def call(name, args):
            try:
                return tools(name, **args)
            except TypeError as exc:  # an argument name that collides with tools()'s own parameters
                return {"error": f"{name}: bad arguments ({exc})"}
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            convo = asyncio.run(self.converse(call))
        else:  # called from inside an event loop: play on a loop of its own
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(1) as pool:
                convo = pool.submit(asyncio.run, self.converse(call)).result()
        if not convo.finished:
            raise RolloutUnfinished(f"{convo.end_reason}: {convo.error}")


class RolloutUnfinished(RuntimeError):
    """The rollout ended without a report (max_turns, timeout, API error); the message says why."""
