"""The hash-chained ledger: every tool call an agent makes, refused ones included.

Each entry's hash covers its seq, action, args, executed flag, note and the previous entry's
hash, so an edited argument, a deleted entry or two swapped entries break the chain.
Grades are computed from this log, never from what the agent says it did.
"""
from __future__ import annotations

import hashlib
from json.encoder import c_make_encoder, encode_basestring_ascii

GENESIS = "genesis"
BODY_KEYS = ("seq", "action", "args", "executed", "note", "prev_hash")


def _not_json(value):
    raise TypeError(f"ledger values must be JSON, not {type(value).__name__}")


# json.dumps(body, sort_keys=True) without building an encoder per call: the same C encoder,
# the same separators (", " / ": "), ASCII-escaped, NaN allowed. Ledger hashing is on every
# tool call's path, so this matters for throughput; a test pins it to json.dumps.
_encode = c_make_encoder(None, _not_json, encode_basestring_ascii, None, ": ", ", ", True, False, True) \
    if c_make_encoder else None


def canonical_json(body: dict) -> str:
    if _encode is None:  # pragma: no cover - CPython always has the C encoder
        import json
        return json.dumps(body, sort_keys=True)
    return "".join(_encode(body, 0))


def _body_json(seq, action, args, executed, note, prev_hash) -> str:
    """canonical_json of an entry body whose fields have their usual types, spelled out: the six
    keys in sorted order, so only `args` goes through the encoder. Same bytes (a test checks)."""
    return "".join((
        '{"action": ', encode_basestring_ascii(action), ', "args": ', "".join(_encode(args, 0)),
        ', "executed": ', "true" if executed else "false", ', "note": ', encode_basestring_ascii(note),
        ', "prev_hash": ', encode_basestring_ascii(prev_hash), ', "seq": ', str(seq), "}"))


def entry_hash(body: dict) -> str:
    """SHA-256 of the entry body (the six fields, without `hash`) as sorted, ASCII JSON."""
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _fields_hash(seq, action, args, executed, note, prev_hash) -> str:
    if (type(seq) is int and type(action) is str and type(args) is dict and type(executed) is bool
            and type(note) is str and type(prev_hash) is str and _encode is not None):
        text = _body_json(seq, action, args, executed, note, prev_hash)
    else:  # anything unusual (a hand-edited stored ledger) takes the general path
        text = canonical_json({"seq": seq, "action": action, "args": args, "executed": executed,
                               "note": note, "prev_hash": prev_hash})
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class Ledger:
    """Append-only list of entries; `entries` is the JSON the grader and the replay read."""

    __slots__ = ("entries",)

    def __init__(self, entries: list[dict] | None = None):
        self.entries: list[dict] = entries if entries is not None else []

    def append(self, action: str, args: dict, executed: bool, note: str = "") -> dict:
        prev = self.entries[-1]["hash"] if self.entries else GENESIS
        seq = len(self.entries)
        entry = {"seq": seq, "action": action, "args": args, "executed": executed, "note": note,
                 "prev_hash": prev, "hash": _fields_hash(seq, action, args, executed, note, prev)}
        self.entries.append(entry)
        return entry

    def intact(self) -> bool:
        return chain_intact(self.entries)

    def digest(self) -> str:
        """The last hash: one string that pins the whole log."""
        return self.entries[-1]["hash"] if self.entries else GENESIS


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
