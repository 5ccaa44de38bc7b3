"""`GateEnvClient`: a typed OpenEnv client for `gate serve`, one episode session per connection.

    import asyncio
    from gate_pipeline.integrations.openenv_client import GateAction, GateEnvClient

    async def main():
        async with GateEnvClient(base_url="http://127.0.0.1:8000") as env:
            result = await env.reset(case_id="train-007", reward="potential")   # or seed=7
            result = await env.step(GateAction(action='{"tool": "list_batches"}'))  # a policy's text
            result = await env.call("profile_batch", batch_id="B-...")             # or typed
            print(result.observation.result, result.reward, result.done)
            grade = (await env.state()).grade                                       # the trainer's

    asyncio.run(main())

    with GateEnvClient(base_url="http://127.0.0.1:8000").sync() as env:        # without asyncio
        result = env.reset(seed=7)

    GateEnvClient(base_url="https://gate.example:8000", token="...")          # a server with a token

openenv-core's `EnvClient` (a WebSocket to `/ws`) with gate's action, observation and state
types. `result.observation` (prompt, result, turn) is what the policy may read. `result.reward`
and `state()` carry label information: feed them to the trainer, never to the policy. A reset
the server refuses (an unknown option, a bad value) raises openenv-core's error (a
`RuntimeError` whose message says what was wrong); a malformed action is an ordinary step whose
result is `{"error": ...}`. The reset observation's `tools` lists the episode's tools (names,
argument schemas, descriptions), as `gate run` gives them to a model.

A server started with a token wants it on every request: `token=` puts it in the URL's user
info (`http://gate:<token>@host:port`), which the WebSocket handshake sends as HTTP Basic
authentication; any OpenEnv client (GenericEnvClient, AutoEnv) takes that URL as it is.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .openenv_models import GateAction, GateObservation, GateState

__all__ = ["GateAction", "GateEnvClient", "GateObservation", "GateState", "with_token"]


def with_token(base_url: str, token: str) -> str:
    """`base_url` with `token` as the password of its user info, which HTTP clients and the WebSocket
    handshake send as Basic authentication (gate serve takes the password as its token)."""
    parts = urlsplit(base_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"gate:{quote(token, safe='')}@{host}"))


class GateEnvClient(EnvClient[GateAction, GateObservation, GateState]):
    """A session on a `gate serve` server: `reset`, `step`, `call`, `state` (async; `.sync()` for sync)."""

    def __init__(self, base_url: str, *args: Any, token: str | None = None, **kwargs: Any):
        super().__init__(with_token(base_url, token) if token else base_url, *args, **kwargs)

    async def reset(self, *, case_id: str | None = None, seed: int | None = None, reward: str | None = None,
                    max_turns: int | None = None, **options: Any) -> StepResult[GateObservation]:
        """Start an episode: on `case_id`, or the case `seed` draws (else the session's generator
        draws one), under `reward` (terminal, dense or potential), truncated at `max_turns`. Options
        left as None are not sent; any other keyword is sent as it is (the server refuses unknown ones)."""
        given = {"case_id": case_id, "seed": seed, "reward": reward, "max_turns": max_turns}
        return await super().reset(**{k: v for k, v in given.items() if v is not None}, **options)

    async def call(self, tool: str, **args: Any) -> StepResult[GateObservation]:
        """One tool call by name (`call("run_sql", query="SELECT ...")`)."""
        return await self.step(GateAction.call(tool, **args))

    def _step_payload(self, action) -> dict[str, Any]:
        if not isinstance(action, GateAction):  # a policy's text, a dict or a [name, args] list
            action = GateAction(action=action)
        return {"action": action.action}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GateObservation]:
        obs = payload.get("observation") or {}
        reward, done = payload.get("reward"), bool(payload.get("done", False))
        observation = GateObservation(prompt=obs.get("prompt", ""), result=obs.get("result", ""),
                                      turn=obs.get("turn", 0), tools=obs.get("tools") or [], done=done, reward=reward)
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> GateState:
        return GateState(**payload)
