"""gate as an OpenEnv server: every WebSocket session its own episode of the one engine.

    gate serve                                   # the train cases, on http://127.0.0.1:8000
    from gate_pipeline.integrations.openenv_client import GateEnvClient

The server is openenv-core's (`create_fastapi_app`, run by uvicorn): `/ws` holds a session per
connection (reset, step, state, close), `/reset`, `/step` and `/state` are OpenEnv's stateless
HTTP endpoints (each request gets a fresh environment, so an episode is played over `/ws`), and
`/health`, `/schema` and `/metadata` describe it. Each session is a `GateServerEnv`: a thin
adapter over the engine's `Session`, as the gymnasium env is (`gymnasium_env.py`): text
observations, actions in any spelling of the one action parser, a malformed action answered
with an error result, never an exception, the case chosen by id or by a seeded generator.

Reset options: `case_id`, `seed` (the case the gymnasium env picks for the same seed),
`reward` (`terminal`, `dense` or `potential`), `max_turns` (default 64), `episode_id`. Anything
else, or a bad value, is refused with one line saying what is wrong.

The observation is what the policy may see: the prompt, the last result, the turn, and
OpenEnv's `reward` and `done`. The step rewards carry label information (dense Layer 2 and the
potential are computed from the truth labels), and so does `state()` (the case id names its
family; the reward parts and the grade): they are for the trainer, never for the policy.

Cases are prepared once per case id (on first use) and shared: every episode opens a private
in-memory copy of its case's database, so sessions never see each other.
"""
from __future__ import annotations

import asyncio
import functools
import json
import signal
import socket
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import numpy as np
from fastapi import WebSocketDisconnect
from openenv.core.env_server import Environment, create_fastapi_app
from openenv.core.env_server.types import EnvironmentMetadata

from ..kernel.engine import Session
from ..kernel.errors import GateError
from ..kernel.pool import CasePool
from ..kernel.rewards import REWARD_MODES
from .openenv_models import GateAction, GateObservation, GateState

DEFAULT_MAX_TURNS = 64
MAX_TURNS_LIMIT = 1024
DEFAULT_MAX_SESSIONS = 64
STEP_THREADS = 8  # more than the slow queries likely at once, few enough to keep GIL handoffs cheap
WS_MAX_BYTES = 1 << 20  # one message; far more than a tool call needs (the sandbox refuses queries over 10,000 characters)
RESET_OPTIONS = ("case_id", "seed", "reward", "max_turns", "episode_id")
AGENT = "openenv"
NO_EPISODE = ("no episode: reset first (over HTTP every request gets a fresh environment; "
              "play an episode over the WebSocket /ws, as GateEnvClient does)")


class ResetOptionError(GateError, ValueError):
    """A reset asked for something gate cannot do (an unknown option, a bad value); one line."""


class ServeError(GateError):
    """The server cannot start (a busy port, an unknown host); one line."""


def _text(value) -> str:
    return json.dumps(value, ensure_ascii=True, default=str)


def _int_option(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ResetOptionError(f"reset option {name!r} must be a whole number {bound}, not {value!r}")
    return value


class GateServerEnv(Environment[GateAction, GateObservation, GateState]):
    """One OpenEnv session: one gate episode at a time over the server's case pool."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    # openenv-core gives every session a thread of its own for building, resetting and closing its
    # environment unless this is set (about 30 KiB per session in the load test); gate's sessions
    # need no thread affinity (each episode's SQLite connection may be used from any thread, one
    # call at a time), so one shared thread does that, and steps go to the server's step threads.
    REQUIRES_SINGLE_THREAD_EXECUTOR = True

    def __init__(self, pool: CasePool, steps: Executor | None = None):
        super().__init__()
        self.pool = pool
        self.steps = steps
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
            raise ResetOptionError(f"unknown reset option {unknown[0]!r}; options: {', '.join(RESET_OPTIONS)}")
        if seed is not None:
            _int_option("seed", seed, 0, 2**63 - 1)
        if episode_id is not None and (not isinstance(episode_id, str) or not 0 < len(episode_id) <= 255):
            raise ResetOptionError(f"reset option 'episode_id' must be text of 1 to 255 characters, not {episode_id!r}")
        reward = options.get("reward", "terminal")
        if not isinstance(reward, str) or reward not in REWARD_MODES:
            raise ResetOptionError(f"reset option 'reward' must be one of {', '.join(REWARD_MODES)}, not {reward!r}")
        max_turns = _int_option("max_turns", options.get("max_turns", DEFAULT_MAX_TURNS), 1, MAX_TURNS_LIMIT)
        case_id = options.get("case_id")
        if case_id is not None and (not isinstance(case_id, str) or case_id not in self.pool):
            raise ResetOptionError(f"reset option 'case_id': no case {case_id!r} among the server's "
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
        return GateObservation(prompt=prepared.case.prompt, result="", turn=0, done=False, reward=None)

    # -- step -----------------------------------------------------------------------------------
    def step(self, action: GateAction, timeout_s: float | None = None, **kwargs: Any) -> GateObservation:
        """One tool call. Never raises: a malformed action, a step before reset or after the end is
        an error result."""
        if self.session is None:
            return GateObservation(result=_text({"error": NO_EPISODE}), turn=0, done=False, reward=0.0)
        with self.busy:
            step = self.session.step(action.action if isinstance(action, GateAction) else action)
        self.parts = step.parts
        self.terminated = self.terminated or step.terminated
        self.truncated = self.truncated or step.truncated
        return GateObservation(prompt=self.session.prepared.case.prompt, result=_text(step.result),
                               turn=self.session.turn, done=step.terminated or step.truncated,
                               reward=float(step.reward))

    async def step_async(self, action: GateAction, timeout_s: float | None = None, **kwargs: Any) -> GateObservation:
        """The step on one of the server's step threads (inline without them). A step is a fraction
        of a millisecond, but a query may run up to the sandbox's budget (about 0.1 s of CPU), and
        SQLite lets go of the GIL while it runs: on a thread, other sessions' steps go on meanwhile."""
        if self.steps is None:
            return self.step(action)
        return await asyncio.get_running_loop().run_in_executor(self.steps, self.step, action)

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

    def get_metadata(self) -> EnvironmentMetadata:
        try:
            installed = version("gate-pipeline")
        except PackageNotFoundError:  # run from a source tree that was never installed
            installed = None
        return EnvironmentMetadata(
            name="gate", version=installed,
            description="gate: a nightly warehouse load. Inspect staging batches with read-only SQL, load or "
                        "quarantine each, submit a report; graded from the warehouse and a hash-chained ledger.")

    def close(self) -> None:
        """End the episode in play, if any (abandoned: graded 0), as the gymnasium env does. (Only a
        server stopping mid-step closes a session while its step still runs: that episode is dropped.)"""
        session, self.session = self.session, None
        if session is not None and not session.done and self.busy.acquire(timeout=5):
            try:
                session.abandon("the session was reset or closed before the episode ended")
            finally:
                self.busy.release()


# -- the app and the server ---------------------------------------------------------------------

class _ClosedByClient:
    """ASGI middleware: a WebSocket the client already closed is not an error. (openenv-core's `/ws`
    handler closes the socket after the client's `close` message; when the client has hung up by
    then, Starlette raises WebSocketDisconnect, which uvicorn would log as a traceback.)"""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def create_gate_app(pool: CasePool, max_sessions: int = DEFAULT_MAX_SESSIONS, step_threads: int = STEP_THREADS):
    """The FastAPI app: openenv-core's routes over `GateServerEnv` sessions on `pool`, their steps on
    `step_threads` shared threads (`app.state.gate_steps`; shut it down when the app is done)."""
    from fastapi.responses import JSONResponse
    steps = ThreadPoolExecutor(step_threads, thread_name_prefix="gate-step")
    app = create_fastapi_app(functools.partial(GateServerEnv, pool, steps), GateAction, GateObservation,
                             max_concurrent_envs=max_sessions)
    app.state.gate_steps = steps
    app.add_middleware(_ClosedByClient)

    async def refused(request, exc: ResetOptionError):  # a bad reset over HTTP: 422 with the reason, no traceback
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    app.add_exception_handler(ResetOptionError, refused)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or ServeError with the reason in one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OverflowError) as exc:
        raise ServeError(f"--host {host}: cannot resolve it ({exc})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(pool: CasePool, host: str = "127.0.0.1", port: int = 8000, max_sessions: int = DEFAULT_MAX_SESSIONS,
          ready: Callable[[str], None] | None = None) -> str | None:
    """Serve until SIGINT or SIGTERM; returns the signal's name (None if the server stopped by itself).

    `ready` gets the base URL once the socket listens (port 0 picks a free port)."""
    import uvicorn
    app = create_gate_app(pool, max_sessions)
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # no per-message compression: a step's messages are a few hundred bytes, and deflating them cost
    # a fifth of the server's time per step in a profile of the load test (benchmarks/bench_serve.py)
    config = uvicorn.Config(app, log_level="warning", access_log=False, ws_max_size=WS_MAX_BYTES,
                            ws_per_message_deflate=False, timeout_graceful_shutdown=5, lifespan="on")
    server = uvicorn.Server(config)
    stopped: list[int] = []

    def note(sig, frame):  # uvicorn stops on the signal, then raises it again here: remember it
        stopped.append(sig)

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
        app.state.gate_steps.shutdown(wait=False)
    if not stopped and not server.started:
        raise ServeError("the server did not start (uvicorn's log above says why)")
    return signal.Signals(stopped[0]).name if stopped else None
