"""The wire types of gate's OpenEnv server, shared by the server and `GateEnvClient`.

- `GateAction`: one tool call, in any spelling gate's action parser takes (JSON text as a policy
  writes it, `{"tool": name, "args": {...}}`, or `[name, args]`). Whatever is inside is the
  engine's business: a malformed action is answered with an error result, never refused here.
- `GateObservation`: what the policy sees: the case's prompt, the last tool result as JSON text
  (`""` after a reset) and the turn, plus OpenEnv's standard `reward` and `done`.
- `GateState`: what the trainer may read (`state()`): the case id, the reward mode, the step
  rewards, the last step's reward parts and, once the episode is over, the grade. It carries
  label information (the case id names its family; the parts and the grade come from the truth
  labels): never show it to the policy.
"""
from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, JsonValue


class GateAction(Action):
    """One tool call. `GateAction(action='{"tool": "list_batches"}')` or `GateAction.call("list_batches")`."""

    action: JsonValue = Field(..., description="a tool call: JSON text, {'tool': name, 'args': {...}} or [name, args]")

    @classmethod
    def call(cls, tool: str, **args: Any) -> "GateAction":
        return cls(action={"tool": tool, "args": args})


class GateObservation(Observation):
    """What the policy reads after a reset or a step (no case id, no reward parts, no grade)."""

    prompt: str = Field(default="", description="the case's prompt")
    result: str = Field(default="", description="the last tool result as JSON text ('' after reset)")
    turn: int = Field(default=0, ge=0, description="tool calls made in this episode")


class GateState(State):
    """The trainer's view of the session's episode; carries label information (never for the policy)."""

    case_id: str | None = Field(default=None, description="the case being played")
    reward_mode: str = Field(default="terminal", description="terminal, dense or potential")
    max_turns: int = Field(default=0, description="the step that reaches it truncates the episode")
    terminated: bool = Field(default=False, description="ended by an accepted report")
    truncated: bool = Field(default=False, description="ended by reaching max_turns")
    rewards: list[float] = Field(default_factory=list, description="each step's reward so far")
    step_parts: dict[str, Any] | None = Field(default=None, description="the last step's shaped reward parts")
    grade: dict[str, Any] | None = Field(default=None, description="the episode's grade, once it is over")
