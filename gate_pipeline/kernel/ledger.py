"""The hash-chained ledger: every tool call an agent makes, refused ones included.

Each entry's hash covers its seq, action, args, executed flag, note and the previous entry's
hash, so an edited argument, a deleted entry or two swapped entries break the chain.
Grades are computed from this log, never from what the agent says it did. A refused call keeps
its arguments only as far as they are bounded (`refused_args`). Whoever needs to
see entries as they are written (the run store, the Dagster tool bridge) passes a listener.
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable

from .actions import PREVIEW_CHARS, PREVIEW_ITEMS, preview

GENESIS = "genesis"
REFUSED_CHARS = 2_000  # the longest text a refused call's entry keeps whole (a refused query, say)
BODY_KEYS = ("seq", "action", "args", "executed", "note", "prev_hash")

# json.dumps(x, sort_keys=True) with one encoder built once (json.dumps builds one per call when
# given options): default separators, ASCII-escaped, NaN allowed
_encode = json.JSONEncoder(sort_keys=True).encode


def canonical_json(body: dict) -> str:
    return _encode(body)


def entry_hash(body: dict) -> str:
    """SHA-256 of the entry body (the six fields, without `hash`) as sorted, ASCII JSON."""
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _string(text: str) -> str:
    """A string as canonical JSON; ASCII letters and digits (tool names, hashes) need no escaping."""
    return f'"{text}"' if text.isascii() and text.isalnum() else _encode(text)


def _fields_hash(seq, action, args, executed, note, prev_hash) -> str:
    if (type(seq) is int and type(action) is str and type(args) is dict and type(executed) is bool
            and type(note) is str and type(prev_hash) is str):
        # canonical_json of the body, its six keys spelled out in sorted order so that only the
        # arguments go through the encoder (the same bytes; a test checks)
        text = "".join(('{"action": ', _encode(action), ', "args": ', _encode(args) if args else "{}",
                        ', "executed": ', "true" if executed else "false", ', "note": ',
                        _encode(note) if note else '""', ', "prev_hash": ', _string(prev_hash),
                        ', "seq": ', str(seq), "}"))
    else:  # anything unusual (a hand-edited stored ledger) takes the general path
        text = canonical_json({"seq": seq, "action": action, "args": args, "executed": executed,
                               "note": note, "prev_hash": prev_hash})
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def refused_args(args):
    """What the entry of a refused call keeps of its arguments: them, when they are as small as an accepted
    call's may be, else a bounded preview (texts cut at REFUSED_CHARS, lists at PREVIEW_ITEMS items), so
    no number of refusals can grow the ledger by more than a bounded amount each."""
    if type(args) is dict and len(args) <= PREVIEW_ITEMS:
        for v in args.values():
            if type(v) is str:
                if len(v) > REFUSED_CHARS:
                    break
            elif type(v) is list:
                if len(v) > PREVIEW_ITEMS or not all(type(x) is str and len(x) <= PREVIEW_CHARS for x in v):
                    break
            elif v is not None and type(v) not in (bool, int, float):
                break
        else:
            return args
    return preview(args, REFUSED_CHARS)


class Ledger:
    """Append-only list of entries; `entries` is the JSON the grader and the replay read.

    `listener`, when given, is called with each entry as soon as it is appended (before the
    call's effect, and before the agent sees the result), hashed. Without a listener the chain
    may be `deferred`: entries are hashed together when the ledger is sealed (when an ended
    episode's entries are first read, `records.EpisodeResult.ledger`), so each entry is hashed
    once, not once when written and again when the grader checks a chain nobody else could have
    touched, and not at all by a run that reads only grades."""

    __slots__ = ("entries", "listener", "deferred", "_sealed")

    def __init__(self, listener: Callable[[dict], None] | None = None, deferred: bool = False):
        self.entries: list[dict] = []
        self.listener = listener
        self.deferred = deferred and listener is None
        self._sealed = 0

    def append(self, action: str, args: dict, executed: bool, note: str = "") -> dict:
        if not executed:
            args = refused_args(args)
        entry = {"seq": len(self.entries), "action": action, "args": args, "executed": executed, "note": note,
                 "prev_hash": None, "hash": None}
        self.entries.append(entry)
        if not self.deferred:
            self.seal()
        if self.listener is not None:
            self.listener(entry)
        return entry

    def seal(self) -> list[dict]:
        """Hash every entry not hashed yet, in order; the entries."""
        entries = self.entries
        prev = entries[self._sealed - 1]["hash"] if self._sealed else GENESIS
        for entry in entries[self._sealed:]:
            entry["prev_hash"] = prev
            prev = entry["hash"] = _fields_hash(entry["seq"], entry["action"], entry["args"], entry["executed"],
                                                entry["note"], prev)
        self._sealed = len(entries)
        return entries


def last_hash(entries: list[dict]) -> str:
    """The hash of the last entry: one string that pins the whole chain ("genesis" when empty)."""
    return entries[-1]["hash"] if entries else GENESIS


def chain_intact(entries: list[dict]) -> bool:
    """Recompute every hash and prev link; any edit, deletion or reordering gives False."""
    prev = GENESIS
    for seq, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("seq") != seq or entry.get("prev_hash") != prev:
            return False
        if any(k not in entry for k in BODY_KEYS):
            return False
        try:
            if _fields_hash(seq, entry["action"], entry["args"], entry["executed"], entry["note"], prev) \
                    != entry.get("hash"):
                return False
        except (TypeError, ValueError, RecursionError):
            return False
        prev = entry["hash"]
    return True
