"""The one action parser: what a replay file, the episode API and a model's reply may send.

An action names a tool and its arguments, in any of these spellings:

    {"tool": "profile_batch", "args": {"batch_id": "B-0930-60-1"}}     # "args" may be left out
    ["profile_batch", {"batch_id": "B-0930-60-1"}]  or  ["list_batches"]
    {"type": "function", "function": {"name": "list_batches", "arguments": "{}"}}   # a chat-completions
    {"name": "list_batches", "arguments": "{}"}                                     # tool call, or its function
    '{"tool": "list_batches"}'                                          # any of the above as JSON text

and the arguments themselves may be JSON text (`{"tool": name, "args": "<json>"}`), which is
how a chat-completions tool call carries them (its `id` is ignored). `parse_action` never raises: a malformed action
comes back with `problem` set, and the engine answers it with a tool error and logs it in the
ledger like any refused call. Whether the tool exists and the arguments fit it is the tools'
business (`tools.check_args`), not the parser's.
"""
from __future__ import annotations

import json
from typing import Container, NamedTuple

from .errors import GateError
from .files import json_lines
from .strict_json import loads as strict_loads

ACTION_KEYS = frozenset({"tool", "args"})
TOOL_CALL_KEYS = frozenset({"id", "type", "function"})  # a chat-completions tool call
FUNCTION_KEYS = frozenset({"name", "arguments"})  # its function
REPR_LIMIT = 500

# what went wrong, for counters (a model run counts each kind)
INVALID_JSON, NOT_AN_OBJECT, MALFORMED = "invalid_json", "not_an_object", "malformed"


class Action(NamedTuple):
    tool: object
    args: object
    problem: str | None = None
    kind: str | None = None  # INVALID_JSON, NOT_AN_OBJECT or MALFORMED when there is a problem


def decode(text: str, loads=json.loads):
    """(value, None) or (None, why). A tool call's arguments and an action's text are read as Python's json reads
    them (an object naming a key twice is its last value): a model transcript an older gate stored is played
    again by `gate verify` through this parser, and must read as it did when it was played."""
    try:
        return loads(text), None
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"
    except RecursionError:
        return None, "not usable JSON (nested too deep)"


def parse_arguments(tool, raw) -> Action:
    """A tool call whose arguments may still be JSON text (a model's `function.arguments`)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return Action(tool, {})  # "no arguments" is how many servers send a zero-argument call
    if isinstance(raw, str):
        args, why = decode(raw)
        if why:
            return Action(tool, raw, f"arguments are {why}; send one JSON object", INVALID_JSON)
    else:
        args = raw
    if not isinstance(args, dict):
        return Action(tool, args, f"arguments must be a JSON object, not {type(args).__name__}", NOT_AN_OBJECT)
    return Action(tool, args)


def tool_call_action(name, raw, parsed: Action | None = None) -> dict:
    """The action a chat-completions tool call (`function.name`, `function.arguments`) is: its arguments
    parsed when they are JSON text, as sent when they are not (the tools then refuse them). The one
    mapping the model agent plays and `gate verify` replays a transcript by."""
    parsed = parsed or parse_arguments(name, raw)
    return {"tool": name, "args": raw if parsed.problem else parsed.args}


def parse_action(value) -> Action:
    """(tool, args) of an action, or the action with `problem` saying what is wrong with it."""
    if isinstance(value, str):
        decoded, why = decode(value)
        if why:
            return Action(None, value, f"action is {why}", INVALID_JSON)
        value = decoded
    if isinstance(value, dict) and "tool" not in value:
        kind = value.get("type", "function")  # compared as text only: an array's == is not a truth value
        if "function" in value and value.keys() <= TOOL_CALL_KEYS and isinstance(kind, str) and kind == "function":
            value = value["function"]
            if not isinstance(value, dict):
                return Action(None, value, "a tool call's 'function' must be an object with 'name' and 'arguments'",
                              MALFORMED)
        if "name" in value and value.keys() <= FUNCTION_KEYS:
            return parse_arguments(value["name"], value.get("arguments"))
    if isinstance(value, dict):
        if "tool" not in value:
            return Action(None, value, "an action needs a 'tool' (and 'args')", MALFORMED)
        extra = sorted(str(k) for k in value.keys() - ACTION_KEYS)
        if extra:
            return Action(value["tool"], value.get("args"),
                          f"unexpected key {extra[0]!r} in action; an action has 'tool' and 'args'", MALFORMED)
        return parse_arguments(value["tool"], value.get("args"))
    if isinstance(value, (list, tuple)) and 1 <= len(value) <= 2:
        return parse_arguments(value[0], value[1] if len(value) == 2 else None)
    return Action(None, value, "an action is {'tool': name, 'args': {...}} or [name, args]", MALFORMED)


PREVIEW_NODES, PREVIEW_DEPTH, PREVIEW_ITEMS, PREVIEW_CHARS = 200, 20, 20, 200


def preview(value, chars: int = PREVIEW_CHARS):
    """A bounded, JSON-ready copy of anything an agent sent: strings over `chars` and long lists cut, deep
    or wide structures stopped, huge integers and other objects named. Its cost does not grow with the input."""
    budget = [PREVIEW_NODES]

    def walk(v, depth):
        budget[0] -= 1
        if budget[0] < 0 or depth > PREVIEW_DEPTH:
            return "..."
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, str):
            return v if len(v) <= chars else f"{v[:chars]}...[{len(v):,} characters]"
        if isinstance(v, int):
            return v if v.bit_length() <= 64 else f"<integer of {v.bit_length():,} bits>"
        if isinstance(v, float):
            return v if v == v and abs(v) != float("inf") else str(v)
        if isinstance(v, (list, tuple)):
            out = [walk(x, depth + 1) for x in v[:PREVIEW_ITEMS]]
            return out + [f"...[{len(v):,} items]"] if len(v) > PREVIEW_ITEMS else out
        if isinstance(v, dict):
            items = list(v.items())[:PREVIEW_ITEMS]
            out = {str(walk(k, depth + 1)): walk(x, depth + 1) for k, x in items}
            if len(v) > PREVIEW_ITEMS:
                out["..."] = f"[{len(v):,} keys]"
            return out
        return f"<{type(v).__name__}>"

    return walk(value, 0)


def ledger_repr(value) -> str:
    """A bounded text rendering of what was sent, for the ledger entry of a refused call."""
    text = json.dumps(preview(value), ensure_ascii=True, sort_keys=True)
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + "...[truncated]"


class TrajectoryError(GateError, ValueError):
    """A trajectory file gate cannot replay; the message names the file and the line."""


def parse_trajectories(text: str, where: str, cases: Container[str] | None = None,
                       cases_where: str = "the cases") -> list[tuple[str, list]]:
    """(case id, actions) per line of a trajectory file: `{"case_id": ..., "calls": [action, ...]}`; with
    `cases`, a case id not in it is an error of its line too (`cases_where` names where they come from).

    Only the line's shape is checked here; each action is parsed when it is replayed, exactly as
    the episode API parses it (a malformed action is a refused call, not a bad file)."""
    out = []
    for n, line in enumerate(json_lines(text), 1):
        if not line.strip():
            continue
        value, why = decode(line, strict_loads)  # a file handed to gate: one meaning, as `gate serve` reads a frame
        if why:
            raise TrajectoryError(f"{where}:{n}: {why}")
        if not isinstance(value, dict) or not isinstance(value.get("calls"), list):
            raise TrajectoryError(f"{where}:{n}: a trajectory is an object with 'case_id' and a list 'calls'")
        case_id = value.get("case_id")
        if not isinstance(case_id, str) or not case_id:
            raise TrajectoryError(f"{where}:{n}: 'case_id' must be a non-empty string, not {ledger_repr(case_id)}")
        if cases is not None and case_id not in cases:
            raise TrajectoryError(f"{where}:{n}: no case {case_id[:80]!r} in {cases_where}")
        out.append((case_id, value["calls"]))
    return out
