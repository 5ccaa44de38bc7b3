"""JSON text gate is handed (a served frame or body, a tool call's arguments, a trajectory line, an option), read
strictly: one meaning, whoever reads it.

Python's json reads an object that names a key twice as its last value (other readers take the first, or refuse),
and reads NaN and Infinity, which JSON has not. Both are refused here, with a message that says which.
"""
from __future__ import annotations

import json
from typing import Any


class KeyTwice(ValueError):
    """An object names a key twice."""


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON number")


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise KeyTwice(f"names the key {key[:80]!r} twice in one object")
            seen.add(key)
    return out


def loads(text: str | bytes) -> Any:
    """The JSON value of `text`, or ValueError (not JSON, a huge number, NaN or Infinity, an object that names a key
    twice: `KeyTwice`). RecursionError, for text nested too deep, is the caller's to say."""
    return json.loads(text, parse_constant=_not_json, object_pairs_hook=_one_value_per_key)
