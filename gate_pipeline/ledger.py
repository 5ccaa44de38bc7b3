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


def entry_hash(body: dict) -> str:
    """SHA-256 of the entry body (the six fields, without `hash`) as sorted, ASCII JSON."""
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


class Ledger:
    """Append-only list of entries; `entries` is the JSON the grader and the replay read."""

    __slots__ = ("entries",)

    def __init__(self, entries: list[dict] | None = None):
        self.entries: list[dict] = entries if entries is not None else []

    def append(self, action: str, args: dict, executed: bool, note: str = "") -> dict:
        prev = self.entries[-1]["hash"] if self.entries else GENESIS
        body = {"seq": len(self.entries), "action": action, "args": args,
                "executed": executed, "note": note, "prev_hash": prev}
        body["hash"] = entry_hash(body)
        self.entries.append(body)
        return body

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
        try:
            body = {k: entry[k] for k in BODY_KEYS}
        except KeyError:
            return False
        try:
            if entry_hash(body) != entry.get("hash"):
                return False
        except (TypeError, ValueError):
            return False
        prev = entry["hash"]
    return True
