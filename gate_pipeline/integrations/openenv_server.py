"""gate as an OpenEnv server: every WebSocket session its own episode of the one engine.

    gate serve                                   # the train cases, on http://127.0.0.1:8000
    uvicorn gate_pipeline.integrations.openenv_app:app
    from gate_pipeline.integrations.openenv_client import GateEnvClient

The routes are OpenEnv's: `/ws` holds a session per connection (messages `reset`, `step`,
`state`, `close`, `mcp`), `/reset`, `/step` and `/state` are OpenEnv's stateless HTTP endpoints
(each request gets a fresh environment, so an episode is played over `/ws`), `/mcp` answers
MCP's JSON-RPC (`tools/list`, `tools/call` and OpenEnv's `openenv/session/create` and `close`),
and `/health`, `/schema`, `/metadata` and `/openapi.json` describe the server. The app is gate's
own (FastAPI), built on openenv-core's types, so that it can hold what openenv-core's server does
not: every session (WebSocket or MCP) counts against `max_sessions` and a per-client cap and is
closed after `idle_timeout` seconds without a message; a token guards every route but `/health`;
every field of every request is checked strictly; a frame that is not a valid message is an
error frame and the session goes on; a slow query cannot hold up other sessions' steps
(`openenv_lanes.py`).

Each session is a `GateServerEnv`: a thin adapter over the engine's `Session`, as the gymnasium
env is (`gymnasium_env.py`): text observations, actions in any spelling of the one action parser
(wrapped as `{"action": ...}` or bare, as a model writes a tool call), a malformed action
answered with an error result, never an exception, the case chosen by id or by a seeded generator.

Reset options: `case_id`, `seed` (the case the gymnasium env picks for the same seed), `reward`
(`terminal`, `dense` or `potential`), `max_turns` (default 64), `episode_id`. Anything else, or a
bad value (`seed: "7"`, `seed: true`), is refused with one line saying what is wrong.

The observation is what the policy may see: the prompt, the last result, the turn, the tool
catalogue after a reset, and OpenEnv's `reward` and `done`. The step rewards carry label
information (dense Layer 2 and the potential are computed from the truth labels), and so does
`state()` (the case id names its family; the reward parts and the grade): they are for the
trainer, never for the policy, and a server without a token serves state()'s trainer-only fields
only when told to (`trainer_state`).

Cases are prepared once per case id (on first use) and shared: every episode opens a private
in-memory copy of its case's database, so sessions never see each other.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import json
import logging
import reprlib
import signal
import socket
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable
from urllib.parse import unquote

import numpy as np
from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import JSONResponse
from openenv.core.env_server import Environment
from openenv.core.env_server.types import EnvironmentMetadata
from starlette.requests import ClientDisconnect
from starlette.websockets import WebSocketDisconnect, WebSocketState

from ..kernel import compile_check, strict_json
from ..kernel.engine import Session
from ..kernel.errors import GateError
from ..kernel.pool import CasePool
from ..kernel.rewards import REWARD_MODES
from ..model_agent.tool_schemas import tool_schemas
from .openenv_http import (
    CONNECTIONS_PER_CLIENT,
    REQUEST_SECONDS,
    RESERVED_DESCRIPTORS,
    SESSION_DESCRIPTORS,
    ClosingWebSocket,
    client_key,
    connection_budget,
    protocol_class,
    raise_open_files_limit,
)
from .openenv_lanes import Lanes
from .openenv_models import ACTION_SCHEMA, GateAction, GateObservation, GateState

DEFAULT_MAX_TURNS = 64
MAX_TURNS_LIMIT = 1024
DEFAULT_MAX_SESSIONS = 64
DEFAULT_IDLE_TIMEOUT = 300.0  # seconds without a message before a session is closed
STEP_THREADS = 8  # threads at normal priority for steps, resets and closes (openenv_lanes.py)
SLOW_THREADS = 8  # the slow lane's threads at least (one per session), at the lowest priority; their queries take
# turns on one baton
REAP_SECONDS = 2.0  # what telling an idle WebSocket client its session is closed may take: one that does not read
# (its connection's buffers full) is cut off after it, so no client holds the reaper, which closes every session
DEFAULT_STALL_TIMEOUT = 60.0  # seconds a connection may hold answers its client does not take before the kernel drops it
STALL_TIMEOUT_RANGE = (5.0, 86_400.0)  # below, a client that merely reads in bursts is dropped; above, a day
REQUEST_TIMEOUT_RANGE = (0.5, 3_600.0)  # for an HTTP request to arrive whole, from its connection or the last answer
SLICE_S = 0.02  # CPU seconds a call may use before it moves to the slow lane
WS_MAX_BYTES = 1 << 20  # one message; far more than a tool call needs (the sandbox refuses queries over 10,000 characters)
HTTP_MAX_BYTES = 1 << 20  # one HTTP request body
RESET_OPTIONS = ("case_id", "seed", "reward", "max_turns", "episode_id")
AGENT = "openenv"
NO_EPISODE = ("no episode: reset first (over HTTP every request gets a fresh environment; "
              "play an episode over the WebSocket /ws, as GateEnvClient does)")
MCP_PROTOCOL = "2025-06-18"
log = logging.getLogger("gate.serve")


class ResetOptionError(GateError, ValueError):
    """A reset asked for something gate cannot do (an unknown option, a bad value); one line."""


class ServeError(GateError):
    """The server cannot start (a busy port, an unknown host, a public address without a token); one line."""


class BadRequest(ValueError):
    """A request or a frame that is not what the protocol says; its message is one line for the client."""


def _text(value) -> str:
    return json.dumps(value, ensure_ascii=True, default=str)


def _int_option(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ResetOptionError(f"reset option {name!r} must be a whole number {bound}, not {_short(value)}")
    return value


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80


def _short(value) -> str:
    """A bounded rendering of a value a client sent (reprlib: safe for deep or huge values)."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped, as `json.dumps` writes it by default (and the WebSocket's
    frames are): text a client sent and an answer echoes (a JSON-RPC id, a protocol version) may hold a lone
    surrogate, which UTF-8 cannot encode, so JSONResponse's UTF-8 body failed with an HTTP 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


class GateServerEnv(Environment[GateAction, GateObservation, GateState]):
    """One OpenEnv session: one gate episode at a time over the server's case pool."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, pool: CasePool):
        super().__init__()
        self.pool = pool
        self.tools = tool_schemas(pool.suite)  # the same schemas `gate run` sends a model
        self.busy = threading.Lock()  # held by a step; close() leaves an episode alone while one runs
        self.session: Session | None = None
        self.case_id: str | None = None
        self.reward_mode = "terminal"
        self.max_turns = DEFAULT_MAX_TURNS
        self.episode_label: str | None = None
        self.rng: np.random.Generator | None = None
        self.parts: dict | None = None
        self.terminated = self.truncated = False

    # -- reset ----------------------------------------------------------------------------------
    def _options(self, seed, episode_id, options: dict) -> tuple:
        unknown = sorted(str(k) for k in options if k not in RESET_OPTIONS)
        if unknown:
            raise ResetOptionError(f"unknown reset option {unknown[0][:80]!r}; options: {', '.join(RESET_OPTIONS)}")
        if seed is not None:
            _int_option("seed", seed, 0, 2**63 - 1)
        if episode_id is not None and (not isinstance(episode_id, str) or not 0 < len(episode_id) <= 255):
            raise ResetOptionError(f"reset option 'episode_id' must be text of 1 to 255 characters, not "
                                   f"{_short(episode_id)}")
        reward = options.get("reward", "terminal")
        if not isinstance(reward, str) or reward not in REWARD_MODES:
            raise ResetOptionError(f"reset option 'reward' must be one of {', '.join(REWARD_MODES)}, not {_short(reward)}")
        max_turns = _int_option("max_turns", options.get("max_turns", DEFAULT_MAX_TURNS), 1, MAX_TURNS_LIMIT)
        case_id = options.get("case_id")
        if case_id is not None and (not isinstance(case_id, str) or case_id not in self.pool):
            raise ResetOptionError(f"reset option 'case_id': no case {_short(case_id)} among the server's "
                                   f"{len(self.pool)} cases")
        return case_id, reward, max_turns

    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> GateObservation:
        """Start an episode on `case_id`, else on the case the seeded generator draws. A bad option
        raises ResetOptionError and leaves the session as it was."""
        case_id, reward, max_turns = self._options(seed, episode_id, options)
        if seed is not None:
            self.rng = np.random.default_rng(seed)  # as gymnasium seeds its envs: the same seed, the same case
        if case_id is None:
            if self.rng is None:
                self.rng = np.random.default_rng()
            case_id = self.pool.cases[int(self.rng.integers(len(self.pool)))].case_id
        prepared = self.pool.prepared(case_id)
        self.close()
        self.case_id, self.reward_mode, self.max_turns = case_id, reward, max_turns
        self.session = Session(prepared, AGENT, reward=reward, stop_at_report=True, max_steps=max_turns)
        self.episode_label = episode_id or self.session.episode_id
        self.parts, self.terminated, self.truncated = None, False, False
        return GateObservation(prompt=prepared.case.prompt, result="", turn=0, tools=self.tools, done=False,
                               reward=None)

    # -- step -----------------------------------------------------------------------------------
    def step(self, action, timeout_s: float | None = None, **kwargs: Any) -> GateObservation:
        """One tool call (a `GateAction`, or the action itself in any spelling of the one parser).
        Never raises: a malformed action, a step before reset or after the end is an error result."""
        session = self.session  # the one this step plays: a close() while it runs takes it from self.session
        if session is None:
            return GateObservation(result=_text({"error": NO_EPISODE}), turn=0, done=False, reward=0.0)
        with self.busy:
            step = session.step(action.action if isinstance(action, GateAction) else action)
        self.parts = step.parts
        self.terminated = self.terminated or step.terminated
        self.truncated = self.truncated or step.truncated
        return GateObservation(prompt=session.prepared.case.prompt, result=_text(step.result), turn=session.turn,
                               done=step.terminated or step.truncated, reward=float(step.reward))

    # -- state, metadata, close -----------------------------------------------------------------
    @property
    def state(self) -> GateState:
        session = self.session
        if session is None:
            return GateState(episode_id=None, step_count=0, reward_mode=self.reward_mode, max_turns=self.max_turns)
        return GateState(episode_id=self.episode_label, step_count=session.turn, case_id=self.case_id,
                         reward_mode=self.reward_mode, max_turns=self.max_turns, terminated=self.terminated,
                         truncated=self.truncated, rewards=list(session.rewards), step_parts=self.parts,
                         grade=session.result.grade.as_dict() if session.result is not None else None)

    def public_state(self) -> GateState:
        """state() without its trainer-only fields: the episode id and the step count (OpenEnv's State)."""
        session = self.session
        return GateState(trainer=False, episode_id=self.episode_label if session else None,
                         step_count=session.turn if session else 0, reward_mode="", max_turns=0)

    def get_metadata(self) -> EnvironmentMetadata:
        return metadata()

    def close(self) -> None:
        """End the episode in play, if any (abandoned: graded 0), as the gymnasium env does. (Only a
        server stopping mid-step closes a session while its step still runs: that episode is dropped.)"""
        session, self.session = self.session, None
        if session is not None and session.result is None and self.busy.acquire(timeout=5):
            try:
                session.close("the session was reset or closed before the episode ended")
            finally:
                self.busy.release()


def metadata() -> EnvironmentMetadata:
    try:
        installed = version("gate-pipeline")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = None
    return EnvironmentMetadata(
        name="gate", version=installed,
        description="gate: a nightly warehouse load. Inspect staging batches with read-only SQL, load or "
                    "quarantine each, submit a report; graded from the warehouse and a hash-chained ledger.")


def observation_payload(obs: GateObservation) -> dict:
    """A step or reset answer as OpenEnv sends it: the observation's own fields, the reward, done."""
    out = {"prompt": obs.prompt, "result": obs.result, "turn": obs.turn}
    if obs.tools:
        out["tools"] = obs.tools
    return {"observation": out, "reward": obs.reward, "done": obs.done}


# -- strict reading of requests -------------------------------------------------------------------

def decode_json(raw: str | bytes, what: str = "message"):
    """The JSON value of a frame or a body, or BadRequest (not JSON, nested too deep, a huge number,
    Python's NaN and Infinity, which JSON has not, or an object that names a key twice). Bytes are UTF-8,
    as a WebSocket's text is: Python's json would guess UTF-16 or UTF-32 from them, or skip a byte-order mark."""
    try:
        return strict_json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except strict_json.KeyTwice as exc:
        raise BadRequest(f"the {what} {exc}") from None
    except RecursionError:
        raise BadRequest(f"the {what} is nested too deep to read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the {what} is not valid JSON ({str(exc)[:120]})") from None


def strict_object(value, what: str, keys: tuple[str, ...] | None = None) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object, not {_kind(value)}")
    if keys is not None:
        extra = sorted(str(k) for k in value if k not in keys)
        if extra:
            raise BadRequest(f"{what}: unexpected field {extra[0][:80]!r}; it has {', '.join(keys)}")
    return value


def _kind(value) -> str:
    return {dict: "an object", list: "an array", str: "text", bool: "true or false", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def step_action(data: dict):
    """The action a step's `data` carries: `{"action": ...}` wrapped (with optional `metadata`), or
    the data itself (a tool call as a model writes it: the engine's parser says what is wrong with it)."""
    if "action" in data and set(data) <= {"action", "metadata"}:
        if "metadata" in data and not isinstance(data["metadata"], dict):
            raise BadRequest(f"step: 'metadata' must be a JSON object, not {_kind(data['metadata'])}")
        return data["action"]
    return data


def reset_arguments(data: dict) -> tuple[Any, Any, dict]:
    """(seed, episode_id, options) of a reset's data, each checked by GateServerEnv.reset."""
    unknown = sorted(str(k) for k in data if k not in RESET_OPTIONS)
    if unknown:
        raise ResetOptionError(f"unknown reset option {unknown[0][:80]!r}; options: {', '.join(RESET_OPTIONS)}")
    options = dict(data)
    return options.pop("seed", None), options.pop("episode_id", None), options


# -- sessions ---------------------------------------------------------------------------------------

class CapacityError(Exception):
    """No place for another session (the server's or this client's cap); one line for the client."""

    def __init__(self, message: str, active: int, limit: int):
        super().__init__(message)
        self.active, self.limit = active, limit


@dataclass
class ServeConfig:
    """What a server holds to: its limits, its token, what state() shows."""

    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_per_client: int | None = None  # None: as many as max_sessions
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # see `bind`
    token: str | None = None
    remote_without_token: bool = False  # serve clients beyond this machine with no token (an explicit choice)
    trainer_state: bool = False  # serve state()'s trainer-only fields without a token
    step_threads: int = STEP_THREADS
    slow_threads: int = SLOW_THREADS
    slice_s: float = SLICE_S
    request_timeout: float = REQUEST_SECONDS  # for an HTTP request to arrive whole (openenv_http.py)

    def __post_init__(self) -> None:
        if self.token is not None:
            if not self.token.strip():
                raise ServeError("the token is empty (--token or GATE_SERVE_TOKEN)")
            if not (self.token.isascii() and self.token.isprintable()):  # a line break no client can send; other
                # characters reach a server in whatever bytes each client encodes them as (UTF-8, Latin-1, escaped)
                raise ServeError("the token holds a character that is not printable ASCII, such as a line break or "
                                 "an accented letter (--token or GATE_SERVE_TOKEN); clients could not send it alike")
        low, high = STALL_TIMEOUT_RANGE
        if not (isinstance(self.stall_timeout, (int, float)) and low <= self.stall_timeout <= high):
            raise ServeError(f"the stall timeout must be from {low:g} to {high:,g} seconds, not {self.stall_timeout!r}")
        low, high = REQUEST_TIMEOUT_RANGE
        if not (isinstance(self.request_timeout, (int, float)) and low <= self.request_timeout <= high):
            raise ServeError(f"the request timeout must be from {low:g} to {high:,g} seconds, not "
                             f"{self.request_timeout!r}")

    @property
    def per_client(self) -> int:
        return min(self.max_per_client or self.max_sessions, self.max_sessions)

    @property
    def shows_trainer_state(self) -> bool:
        return bool(self.token) or self.trainer_state


@dataclass
class ServedSession:
    id: str
    env: GateServerEnv
    client: str
    kind: str  # "ws" or "mcp"
    last: float = field(default_factory=time.monotonic)
    busy: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    on_reap: Callable[[], Any] | None = None  # a WebSocket's: closes the connection
    task: asyncio.Task | None = None  # a WebSocket's: the task serving it (cancelled when it cannot be closed)
    cut_off: bool = False  # the reaper cancelled `task`: a client that did not read what it was sent


class Sessions:
    """Every open session, WebSocket or MCP, under one cap, one per-client cap and one idle timeout."""

    def __init__(self, pool: CasePool, config: ServeConfig, lanes: Lanes):
        self.pool, self.config, self.lanes = pool, config, lanes
        self.open: dict[str, ServedSession] = {}
        self.reaped = 0

    def per_client(self, client: str) -> int:
        return sum(1 for s in self.open.values() if s.client == client)

    def add(self, client: str, kind: str) -> ServedSession:
        """A new session, counted at once (no await between the check and the count)."""
        limit = self.config.max_sessions
        if len(self.open) >= limit:
            raise CapacityError(f"the server has {len(self.open)} sessions open, its most (--max-sessions "
                                f"{limit}); an idle session is closed after {self.config.idle_timeout:g} s",
                                len(self.open), limit)
        mine, cap = self.per_client(client), self.config.per_client
        if mine >= cap:
            raise CapacityError(f"this client ({client}) has {mine} sessions open, the most one client may "
                                f"(--max-per-client {cap})", mine, cap)
        session = ServedSession(uuid.uuid4().hex, GateServerEnv(self.pool), client, kind)
        self.open[session.id] = session
        return session

    async def close(self, session: ServedSession) -> None:
        if self.open.pop(session.id, None) is not None:
            await self.lanes.run(session.env.close)
            self.lanes.forget(id(session.env))

    def idle(self, now: float) -> list[ServedSession]:
        return [s for s in self.open.values() if s.busy == 0 and now - s.last > self.config.idle_timeout]

    async def reap_forever(self) -> None:
        interval = max(0.05, min(5.0, self.config.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            for session in self.idle(time.monotonic()):
                if session.busy or time.monotonic() - session.last <= self.config.idle_timeout:
                    continue  # active again while an earlier one was being closed (that may take REAP_SECONDS)
                self.reaped += 1
                await self.reap(session)

    async def reap(self, session: ServedSession) -> None:
        """Close an idle session: its WebSocket client told so, within REAP_SECONDS; a client that does not
        read (a send to it waits for ever) is cut off, the task serving it cancelled."""
        if session.on_reap is not None:
            try:
                await asyncio.wait_for(session.on_reap(), REAP_SECONDS)
            except asyncio.TimeoutError:
                if session.task is not None and not session.task.done():
                    session.cut_off = True
                    session.task.cancel()
            except Exception:  # noqa: BLE001  (the connection is gone already)
                pass
        await self.close(session)


# -- MCP's JSON-RPC ---------------------------------------------------------------------------------

RPC_PARSE, RPC_INVALID, RPC_METHOD, RPC_PARAMS, RPC_SERVER = -32700, -32600, -32601, -32602, -32000


# the methods a notification carries out: those whose effect is not their answer (a tools/call steps its session,
# a close frees it). Anything else notified is ignored: a session created by a notification is one nobody is told
# of, held until its idle timeout against its client's cap.
NOTIFIED = frozenset({"tools/call", "openenv/session/close"})


def rpc_error(code: int, message: str, request_id=None, data: dict | None = None) -> dict:
    error: dict = {"code": code, "message": message}
    if data:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": request_id}


def rpc_result(result, request_id) -> dict:
    return {"jsonrpc": "2.0", "result": result, "id": request_id}


class Gate:
    """The server's state and handlers, shared by the routes (one per app)."""

    def __init__(self, pool: CasePool, config: ServeConfig):
        self.pool, self.config = pool, config
        # a slow-lane thread for every session that may have a call there: none waits for another's to end
        self.lanes = Lanes(config.step_threads, config.slice_s, slow_threads=max(config.slow_threads, config.max_sessions))
        # a compile-check child ready for each fast thread: no session's first statement waits for one to start
        compile_check.warm(config.step_threads)
        self.sessions = Sessions(pool, config, self.lanes)
        self.mcp_tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                           "inputSchema": t["function"]["parameters"]} for t in tool_schemas(pool.suite)]

    def shown_state(self, env: GateServerEnv) -> dict:
        state = env.state if self.config.shows_trainer_state else env.public_state()
        return state.model_dump()

    # -- one episode's messages (the WebSocket's and MCP's) ------------------------------------------
    async def reset(self, env: GateServerEnv, data: dict) -> dict:
        seed, episode_id, options = reset_arguments(data)
        # no key: a reset that prepares a case for the first time may run long, and that says nothing
        # about the session's steps (a long reset's thread still moves off the fast threads)
        obs = await self.lanes.run(lambda: env.reset(seed=seed, episode_id=episode_id, **options))
        return observation_payload(obs)

    async def step(self, env: GateServerEnv, action, client: str | None = None) -> GateObservation:
        """A step on a lane thread; `client` (the session's) is whose turns its long queries take on the baton."""
        return await self.lanes.run(env.step, action, key=id(env), owner=client)

    # -- MCP ------------------------------------------------------------------------------------------
    async def rpc(self, message, client: str, session: ServedSession | None = None) -> dict | None:
        """One JSON-RPC request (already decoded) answered; None for a notification."""
        if not isinstance(message, dict):
            return rpc_error(RPC_INVALID, f"a JSON-RPC request is an object, not {_kind(message)}")
        request_id = message.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int, type(None))):
            return rpc_error(RPC_INVALID, "'id' must be text, a whole number or null")
        extra = sorted(str(k) for k in message if k not in ("jsonrpc", "method", "params", "id"))
        if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str) or extra:
            why = (f"unexpected field {extra[0][:80]!r}" if extra else
                   "'jsonrpc' must be \"2.0\"" if message.get("jsonrpc") != "2.0" else "'method' must be text")
            return rpc_error(RPC_INVALID, f"invalid request: {why}", request_id)
        method, params = message["method"], message.get("params", {})
        if "id" not in message:  # a notification: never answered, not even with an error
            if method in NOTIFIED and isinstance(params, dict):
                try:
                    await self._rpc_method(method, params, client, session)
                except (BadRequest, ResetOptionError, CapacityError, LookupError):
                    pass  # what would be its error has no one to go to
            return None
        if not isinstance(params, dict):
            return rpc_error(RPC_PARAMS, "'params' must be an object", request_id)
        try:
            return rpc_result(await self._rpc_method(method, params, client, session), request_id)
        except BadRequest as exc:
            return rpc_error(RPC_PARAMS, str(exc), request_id)
        except ResetOptionError as exc:
            return rpc_error(RPC_PARAMS, str(exc), request_id)
        except CapacityError as exc:
            return rpc_error(RPC_SERVER, str(exc), request_id,
                             {"active_sessions": exc.active, "max_sessions": exc.limit})
        except LookupError as exc:
            return rpc_error(RPC_METHOD, str(exc.args[0]), request_id)

    async def _rpc_method(self, method: str, params: dict, client: str, session: ServedSession | None):
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {"protocolVersion": asked if isinstance(asked, str) and 0 < len(asked) <= 40 else MCP_PROTOCOL,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "gate", "version": metadata().version or "0"}}
        if method == "ping":
            return {}
        if method == "tools/list":
            strict_object(params, "tools/list params", ("cursor", "session_id"))
            return {"tools": self.mcp_tools}
        if method == "tools/call":
            return await self._tools_call(strict_object(params, "tools/call params",
                                                        ("name", "arguments", "session_id")), session)
        if method == "openenv/session/create":
            if session is not None:
                return {"session_id": session.id}
            options = strict_object(params.get("reset", {}), "openenv/session/create 'reset'")
            strict_object(params, "openenv/session/create params", ("reset",))
            created = self.sessions.add(client, "mcp")
            created.busy += 1
            try:
                first = await self.reset(created.env, options)
            except BaseException:
                await self.sessions.close(created)
                raise
            finally:
                created.busy -= 1
                created.last = time.monotonic()
            return {"session_id": created.id, "observation": first["observation"]}
        if method == "openenv/session/close":
            strict_object(params, "openenv/session/close params", ("session_id",))
            target = self._mcp_session(params.get("session_id"))
            if session is not None and target is session:
                raise BadRequest("this WebSocket's own session closes with the connection")
            await self.sessions.close(target)
            return {"session_id": target.id, "closed": True}
        raise LookupError(f"method not found: {method[:80]!r}; gate serves initialize, ping, tools/list, tools/call, "
                          "openenv/session/create, openenv/session/close")

    def _mcp_session(self, session_id) -> ServedSession:
        if not isinstance(session_id, str):
            raise BadRequest("'session_id' (text) is required: create one with openenv/session/create")
        found = self.sessions.open.get(session_id)
        if found is None or found.kind != "mcp":
            raise BadRequest(f"no open MCP session {_short(session_id)} (an idle session is closed after "
                             f"{self.config.idle_timeout:g} s)")
        return found

    async def _tools_call(self, params: dict, session: ServedSession | None) -> dict:
        name = params.get("name")
        if not isinstance(name, str):
            raise BadRequest("tools/call: 'name' (text) is required")
        arguments = params.get("arguments", {})
        if not isinstance(arguments, dict):
            raise BadRequest(f"tools/call: 'arguments' must be an object, not {_kind(arguments)}")
        target = session if session is not None and "session_id" not in params else \
            self._mcp_session(params.get("session_id"))
        target.busy += 1
        try:
            async with target.lock:  # one call at a time per session
                obs = await self.step(target.env, {"tool": name, "args": arguments}, target.client)
        finally:
            target.busy -= 1
            target.last = time.monotonic()
        result = json.loads(obs.result) if obs.result else None
        return {"content": [{"type": "text", "text": obs.result}],
                "isError": isinstance(result, dict) and "error" in result,
                "_meta": {"turn": obs.turn, "done": obs.done, "reward": obs.reward}}


# -- the app ----------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return host == "localhost"


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def presented_token(scope) -> str | None:
    """The token a request carries: `Authorization: Bearer <token>`, or HTTP Basic with the token as
    the password (what a URL `http://gate:<token>@host:port` sends, from any OpenEnv client)."""
    value = _header(scope, b"authorization")
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() == "bearer":
        return rest.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(rest.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
    return None


class Guard:
    """ASGI middleware: with a token, every request but `GET /health` must carry it (else 401); with
    none, only clients on this machine are served (unless the server was told otherwise)."""

    def __init__(self, app, config: ServeConfig):
        self.app, self.config = app, config
        self.token = config.token.encode() if config.token else None

    def refusal(self, scope) -> str | None:
        if scope["type"] == "http" and scope.get("path") == "/health" and scope.get("method") in ("GET", "HEAD"):
            return None
        if self.token is not None:
            given = presented_token(scope)
            if given is None:
                return "this server requires its token: send 'Authorization: Bearer <token>'"
            # a token in a URL's user info arrives percent-encoded from some clients (websockets), decoded
            # from others (requests, httpx): either form of the right token is the token
            if hmac.compare_digest(given.encode(), self.token) or (
                    "%" in given and hmac.compare_digest(unquote(given).encode(), self.token)):
                return None
            return "wrong token"
        client = (scope.get("client") or ("", 0))[0]
        if self.config.remote_without_token or is_loopback(client or ""):
            return None
        return "this server has no token and serves only its own machine (start it with --token)"

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        why = self.refusal(scope)
        if why is None:
            return await self.app(scope, receive, send)
        body = json.dumps({"detail": why}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers.append((b"www-authenticate", b'Bearer realm="gate"'))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})


async def bounded_body(request, what: str) -> bytes:
    """A request's body, read no further than HTTP_MAX_BYTES (else BadRequest): a huge body costs nothing."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > HTTP_MAX_BYTES:
                raise BadRequest(f"the {what} body is over {HTTP_MAX_BYTES:,} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # the client hung up before the body ended: nobody to answer, nothing to log
        raise BadRequest(f"the client hung up before the {what} body ended") from None
    return b"".join(chunks)


def error_frame(message: str, code: str, **extra) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def create_gate_app(pool: CasePool, config: ServeConfig | None = None):
    """The ASGI app: gate's OpenEnv routes over `GateServerEnv` sessions on `pool`, behind the token
    guard. `app.state.gate` holds the sessions and the lanes; they stop with the app's lifespan."""
    config = config or ServeConfig()
    gate = Gate(pool, config)

    @asynccontextmanager
    async def lifespan(app):
        reaper = asyncio.create_task(gate.sessions.reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            for session in list(gate.sessions.open.values()):
                gate.sessions.open.pop(session.id, None)
                session.env.close()
            gate.lanes.shutdown()

    info = metadata()
    app = FastAPI(title="gate (OpenEnv)", version=info.version or "0", description=info.description,
                  lifespan=lifespan, openapi_url="/openapi.json", docs_url=None, redoc_url=None,
                  default_response_class=AsciiJSONResponse)
    app.state.gate = gate

    def refused(message: str, status: int = 422) -> JSONResponse:
        return AsciiJSONResponse(status_code=status, content={"detail": message})

    async def body_of(request: Request, what: str) -> dict:
        raw = await bounded_body(request, what)
        if not raw.strip():
            return {}
        return strict_object(decode_json(raw, f"{what} body"), f"the {what} body")

    def body_doc(schema: dict) -> dict:
        return {"requestBody": {"content": {"application/json": {"schema": schema}}}}

    reset_schema = {"type": "object", "additionalProperties": False, "properties": {
        "case_id": {"type": "string"}, "seed": {"type": "integer", "minimum": 0},
        "reward": {"enum": list(REWARD_MODES)}, "max_turns": {"type": "integer", "minimum": 1,
                                                              "maximum": MAX_TURNS_LIMIT},
        "episode_id": {"type": "string", "minLength": 1, "maxLength": 255}}}
    step_schema = {"type": "object", "required": ["action"], "additionalProperties": False, "properties": {
        "action": ACTION_SCHEMA, "timeout_s": {"type": "number", "exclusiveMinimum": 0},
        "request_id": {"type": "string", "maxLength": 255}}}

    @app.post("/reset", tags=["Environment Control"], openapi_extra=body_doc(reset_schema),
              summary="A fresh environment's first observation (play episodes over /ws)")
    async def http_reset(request: Request):
        try:
            data = await body_of(request, "reset")
            env = GateServerEnv(pool)
            try:
                return await gate.reset(env, data)
            finally:
                await gate.lanes.run(env.close)
        except (BadRequest, ResetOptionError) as exc:
            return refused(str(exc))

    @app.post("/step", tags=["Environment Control"], openapi_extra=body_doc(step_schema),
              summary="A step on a fresh environment (an error result: play episodes over /ws)")
    async def http_step(request: Request):
        try:
            data = strict_object(await body_of(request, "step"), "the step body", ("action", "timeout_s", "request_id"))
            if "action" not in data:
                raise BadRequest("the step body needs 'action'")
            action = step_action(strict_object(data["action"], "'action'"))
            timeout = data.get("timeout_s")
            if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                        or not 0 < timeout < float("inf")):
                raise BadRequest(f"'timeout_s' must be a finite number above 0, not {_short(timeout)}")
            request_id = data.get("request_id")
            if request_id is not None and (not isinstance(request_id, str) or len(request_id) > 255):
                raise BadRequest("'request_id' must be text of at most 255 characters")
        except BadRequest as exc:
            return refused(str(exc))
        return observation_payload(await gate.step(GateServerEnv(pool), action))

    @app.get("/state", tags=["State Management"], summary="A fresh environment's state (no episode)")
    async def http_state():
        return GateServerEnv(pool).public_state().model_dump()

    @app.get("/health", tags=["Health"])
    async def health():
        return {"status": "healthy"}

    @app.head("/health", include_in_schema=False)  # load balancers' and `curl -I`'s health check
    async def health_head():
        return Response(status_code=200)

    @app.get("/metadata", tags=["Environment Info"])
    async def get_metadata():
        return info.model_dump()

    @app.get("/schema", tags=["Schema"])
    async def schema():
        return {"action": ACTION_SCHEMA, "observation": GateObservation.model_json_schema(),
                "state": GateState.model_json_schema()}

    @app.post("/mcp", tags=["MCP"], summary="MCP JSON-RPC: tools/list, tools/call, openenv/session/create|close")
    async def mcp(request: Request):
        client = client_key((request.client.host if request.client else "") or "")
        try:
            message = decode_json(await bounded_body(request, "request"), "request")
        except BadRequest as exc:
            return rpc_error(RPC_PARSE, str(exc))
        answer = await gate.rpc(message, client)
        return answer if answer is not None else Response(status_code=202)  # a notification: no body

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        client = client_key((websocket.client.host if websocket.client else "") or "")
        try:
            session = gate.sessions.add(client, "ws")
        except CapacityError as exc:
            try:
                await websocket.send_text(error_frame(str(exc), "CAPACITY_REACHED", active_sessions=exc.active,
                                                      max_sessions=exc.limit))
                await websocket.close(code=1013, reason="no place for another session")
            except (RuntimeError, WebSocketDisconnect):
                pass
            return

        async def on_reap():
            if websocket.client_state == WebSocketState.CONNECTED:
                await websocket.send_text(error_frame(f"session closed after {config.idle_timeout:g} s without a "
                                                      "message", "SESSION_IDLE"))
                await websocket.close(code=1000, reason="idle")

        session.on_reap, session.task = on_reap, asyncio.current_task()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                session.last = time.monotonic()
                session.busy += 1
                try:
                    answer, stop = await frame(session, message)
                finally:
                    session.busy -= 1
                    session.last = time.monotonic()
                if answer is not None:
                    await websocket.send_text(answer)
                if stop:
                    break
        except (WebSocketDisconnect, RuntimeError):  # the client hung up, or the reaper closed it
            pass
        except asyncio.CancelledError:  # the reaper's cut, or the server stopping while a send to a client that
            current = asyncio.current_task()  # does not read waits: this connection ends here, quietly (not as
            if current is not None:  # an "Exception in ASGI application" traceback)
                current.uncancel()
        finally:
            try:
                await gate.sessions.close(session)
                if websocket.client_state == WebSocketState.CONNECTED:  # a client that does not read: not waited for
                    await asyncio.wait_for(websocket.close(), REAP_SECONDS)
            except (RuntimeError, WebSocketDisconnect, asyncio.TimeoutError):  # the client hung up first
                pass
            except asyncio.CancelledError:  # the server stopping past its grace period: its threads are gone
                pass

    async def frame(session: ServedSession, message: dict) -> tuple[str | None, bool]:
        """(the answer, whether the session ends) of one WebSocket frame; never raises."""
        text = message.get("text")
        if text is None:
            raw = message.get("bytes") or b""
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                return error_frame("a binary frame that is not UTF-8 text; send JSON text", "INVALID_JSON"), False
        try:
            msg = decode_json(text)
        except BadRequest as exc:
            return error_frame(str(exc), "INVALID_JSON"), False
        env = session.env
        try:
            if not isinstance(msg, dict):
                raise BadRequest(f"a message is a JSON object with 'type' (reset, step, state, close, mcp), "
                                 f"not {_kind(msg)}")
            kind = msg.get("type")
            if kind not in ("reset", "step", "state", "close", "mcp"):
                why = f"unknown message type {_short(kind)}" if isinstance(kind, str) else "a message needs a 'type'"
                return error_frame(f"{why}: reset, step, state, close or mcp", "UNKNOWN_TYPE"), False
            if kind in ("state", "close"):
                strict_object(msg, f"a {kind} message", ("type",))
            else:
                strict_object(msg, f"a {kind} message", ("type", "data"))
            if kind == "close":
                return None, True
            if kind == "state":
                return json.dumps({"type": "state", "data": gate.shown_state(env)}), False
            if kind == "mcp":
                answer = await gate.rpc(msg.get("data"), session.client, session)
                return json.dumps({"type": "mcp", "data": answer}), False
            if kind == "reset":
                data = strict_object(msg.get("data", {}), "a reset's 'data'")
                return json.dumps({"type": "observation", "data": await gate.reset(env, data)}), False
            if "data" not in msg:
                raise BadRequest("a step message needs 'data': the tool call")
            action = step_action(strict_object(msg["data"], "a step's 'data'"))
            obs = await gate.step(env, action, session.client)
            return json.dumps({"type": "observation", "data": observation_payload(obs)}), False
        except BadRequest as exc:
            return error_frame(str(exc), "VALIDATION_ERROR"), False
        except ResetOptionError as exc:
            return error_frame(str(exc), "VALIDATION_ERROR"), False
        except Exception as exc:  # noqa: BLE001  (a fault of gate's: the frame fails, the session goes on)
            log.warning("gate serve: a %s message failed: %s: %s", msg.get("type") if isinstance(msg, dict) else "?",
                        type(exc).__name__, exc)
            return error_frame(f"{type(exc).__name__}: {exc}", "EXECUTION_ERROR"), False

    return Guard(app, config)


def resolve(host: str, port: int):
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OverflowError) as exc:
        raise ServeError(f"--host {host}: cannot resolve it ({exc})") from None
    return infos[0]


def bind(host: str, port: int, stall_timeout: float = DEFAULT_STALL_TIMEOUT) -> socket.socket:
    """A listening socket on host:port, or ServeError with the reason in one line.

    Every connection it accepts (they inherit TCP_USER_TIMEOUT, where the platform has it) is dropped by
    the kernel once bytes sent to it have waited `stall_timeout` seconds to be taken: its client has not
    made room in its receive buffer for the next packet in that time, or the network has gone. This holds
    for every connection, in a session or not: a client that leaves an answer unread for that long loses
    its connection, however long the idle timeout. A client that stops reading is cut off by the reaper,
    but closing a connection waits for its unsent bytes: without this, such a client kept its connection
    and the megabytes queued for it for as long as it pleased, and could pile them up session after
    session. A client that reads a little now and then can still keep them while it reads (each read
    starts the time again). A client sent nothing, whatever it does not send, is never dropped by it.
    (`uvicorn gate_pipeline.integrations.openenv_app:app` listens on uvicorn's socket: there, this is
    uvicorn's and the system's business.)"""
    family, kind, proto, _, address = resolve(host, port)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # milliseconds, an unsigned int; 0 would mean the system's default
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, round(stall_timeout * 1000))
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def check_exposure(host: str, port: int, config: ServeConfig) -> None:
    """A server reachable from other machines needs a token, unless told to serve without one."""
    address = resolve(host, port)[4][0]
    if not is_loopback(address) and not config.token and not config.remote_without_token:
        raise ServeError(f"--host {host} is reachable from other machines: give a token (--token or "
                         "GATE_SERVE_TOKEN), or say --no-token to serve anyone who reaches the port")


def serve(pool: CasePool, host: str = "127.0.0.1", port: int = 8000, config: ServeConfig | None = None,
          ready: Callable[[str], None] | None = None) -> str | None:
    """Serve until SIGINT or SIGTERM; returns the signal's name (None if the server stopped by itself).

    `ready` gets the base URL once the socket listens (port 0 picks a free port)."""
    import uvicorn
    config = config or ServeConfig()
    check_exposure(host, port, config)
    total = connection_budget(raise_open_files_limit(), config.max_sessions)
    own = RESERVED_DESCRIPTORS + SESSION_DESCRIPTORS * config.max_sessions
    if config.max_sessions > total:
        raise ServeError(f"{config.max_sessions:,} sessions need more open files than this process may have "
                         f"({total + own:,}, of which {own:,} are the server's own for its sessions): raise "
                         f"`ulimit -n` or lower --max-sessions")
    if max(config.per_client, 1) > total // 2:  # a client holds at most half of the connections
        raise ServeError(f"{config.per_client:,} sessions per client are more than half of the {total:,} connections "
                         f"this process's open files leave ({total + own:,}, of which {own:,} are the server's own "
                         f"for its sessions): lower --max-per-client to {total // 2:,} or less, or raise `ulimit -n`")
    # a client's connections: its sessions (each WebSocket is one) and 64 more, or the usual cap where the limit
    # leaves room; never more than half of what the limit leaves, whatever its sessions
    per_client = min(max(config.per_client + 64, min(CONNECTIONS_PER_CLIENT, total // 2)), total // 2)
    app = create_gate_app(pool, config)
    sock = bind(host, port, config.stall_timeout)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # no per-message compression: a step's messages are a few hundred bytes, and deflating them cost
    # a fifth of the server's time per step in a profile of the load test (benchmarks/bench_serve.py)
    uv_config = uvicorn.Config(app, log_level="warning", access_log=False, ws_max_size=WS_MAX_BYTES,
                               ws_per_message_deflate=False, timeout_graceful_shutdown=5, lifespan="on",
                               http=protocol_class(config.request_timeout, per_client, total),
                               ws=ClosingWebSocket)
    server = uvicorn.Server(uv_config)
    stopped: list[int] = []

    def note(sig, frame):  # uvicorn stops on the signal, then raises it again here: remember it
        stopped.append(sig)
        server.should_exit = True  # one that comes after the check below and before uvicorn takes over stops it too

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, note) for sig in handled}
    try:
        if ready is not None:
            ready(f"http://{shown}:{bound_port}")
        if not stopped:  # a signal before uvicorn took over the handlers stops it before it starts
            server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if not stopped and not server.started:
        raise ServeError("the server did not start (uvicorn's log above says why)")
    return signal.Signals(stopped[0]).name if stopped else None
