"""The wire types of gate's OpenEnv server, shared by the server and `GateEnvClient`.

- `GateAction`: one tool call, in any spelling gate's one action parser takes. On the wire a
  step's `data` is the tool call as a model writes it (`{"tool": name, "args": {...}}`, or a
  chat-completions tool call `{"type": "function", "function": {"name": ..., "arguments": "..."}}`)
  or that call wrapped as `{"action": ...}` (what `GateAction` sends). Whatever is inside is the
  engine's business: a malformed action is answered with an error result, never refused here.
- `GateObservation`: what the policy sees: the case's prompt, the last tool result as JSON text
  (`""` after a reset), the turn, and after a reset the tool catalogue (`tools`: the names,
  argument schemas and descriptions `gate run` sends a model), plus OpenEnv's `reward` and `done`.
- `GateState`: what the trainer may read (`state()`): the case id, the reward mode, the step
  rewards, the last step's reward parts and, once the episode is over, the grade. It carries
  label information (the case id names its family; the parts and the grade come from the truth
  labels): never show it to the policy. A server without a token serves these fields only when
  started with `--trainer-state`; otherwise `trainer` is false and they are empty.
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
    tools: list[dict[str, Any]] = Field(default_factory=list, description=(
        "after a reset: the episode's tools as chat-completions function schemas (name, description, "
        "parameters), the ones `gate run` sends a model; empty after a step"))


class GateState(State):
    """The trainer's view of the session's episode; carries label information (never for the policy)."""

    trainer: bool = Field(default=True, description="whether the trainer-only fields below are filled in")
    case_id: str | None = Field(default=None, description="the case being played")
    reward_mode: str = Field(default="terminal", description="terminal, dense or potential")
    max_turns: int = Field(default=0, description="the step that reaches it truncates the episode")
    terminated: bool = Field(default=False, description="ended by an accepted report")
    truncated: bool = Field(default=False, description="ended by reaching max_turns")
    rewards: list[float] = Field(default_factory=list, description="each step's reward so far")
    step_parts: dict[str, Any] | None = Field(default=None, description="the last step's shaped reward parts")
    grade: dict[str, Any] | None = Field(default=None, description="the episode's grade, once it is over")


_ARGS = {"type": "object", "description": "the tool's arguments (see the reset observation's tools)"}

# What `/schema` publishes as the action: the three shapes a step's `data` may take.
ACTION_SCHEMA: dict[str, Any] = {
    "title": "GateAction",
    "description": ("One tool call, as a model writes it. The tools, their arguments and descriptions are in the "
                    "reset observation's `tools`. A malformed call is answered with an error result."),
    "anyOf": [
        {"title": "ToolCall", "type": "object", "required": ["tool"], "additionalProperties": False,
         "properties": {"tool": {"type": "string", "description": "the tool's name"}, "args": _ARGS}},
        {"title": "ChatCompletionsToolCall", "type": "object", "required": ["function"], "additionalProperties": False,
         "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                        "function": {"type": "object", "required": ["name"], "additionalProperties": False,
                                     "properties": {"name": {"type": "string"},
                                                    "arguments": {"type": "string",
                                                                  "description": "the arguments as JSON text"}}}}},
        {"title": "WrappedAction", "type": "object", "required": ["action"], "additionalProperties": False,
         "properties": {"action": {"description": "a ToolCall, a ChatCompletionsToolCall, [name, args], or any of "
                                                  "them as JSON text"},
                        "metadata": {"type": "object"}}},
    ],
}
