"""Tool calls a model wrote as text, for servers that return them unparsed (opt-in: `--text-tool-calls`).

A vLLM or llama.cpp server started without a tool parser hands the model's tool calls back as the
reply's text. Two common shapes are read here:

    <tool_call>{"name": "list_batches", "arguments": {}}</tool_call>      # Hermes / Qwen, one or more
    {"name": "profile_batch", "arguments": {"batch_id": "B-1"}}           # a bare JSON object (Llama)

(`"parameters"` is taken for `"arguments"`, a ```json fence around a bare object is allowed). Only
the name and the arguments' JSON text come out of here: the arguments go through the one action
parser like a structured call's, so a `<tool_call>` block that is not JSON is answered as a call
with invalid JSON, never dropped. Text that is neither shape is no call (the reply gets a nudge).
"""
from __future__ import annotations

import json
import re

from ..kernel.actions import decode
from .limits import MAX_CALLS_PER_REPLY

HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
FENCE_TAG = re.compile(r"[A-Za-z0-9_-]*")  # the language named after a code fence's opening ```
NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')
MAX_TEXT = 200_000  # a reply longer than this is not searched for calls


def _call_of(obj) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a decoded `{"name": ..., "arguments": ...}`, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if args is None:
        return obj["name"], ""
    return obj["name"], args if isinstance(args, str) else json.dumps(args)


def parse_text_calls(content) -> tuple[list[tuple[str, str]], str | None, int]:
    """The tool calls written in a reply's text, as (name, arguments JSON text), the text left around
    them (None when nothing is left), and how many calls beyond MAX_CALLS_PER_REPLY were dropped. No
    call found: ([], content unchanged, 0)."""
    if not isinstance(content, str) or not content.strip() or len(content) > MAX_TEXT:
        return [], content, 0
    if "<tool_call>" in content:
        calls = []
        blocks = HERMES.findall(content)
        for block in blocks[:MAX_CALLS_PER_REPLY]:
            value, why = decode(block.strip())
            call = _call_of(value) if why is None else None
            if call is None:  # a tool call the model meant, in a shape that does not read: answered, not dropped
                found = NAME.search(block)
                call = (found.group(1) if found else "", block.strip())
            calls.append(call)
        rest = HERMES.sub("", content).strip()
        return calls, rest or None, max(0, len(blocks) - MAX_CALLS_PER_REPLY)
    text = content.strip()
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):  # one fenced block: what it holds
        inner = text[3:-3]  # (sliced, not matched by a pattern: a reply's length in time, whatever it holds)
        tag = FENCE_TAG.match(inner)
        text = inner[tag.end() if tag else 0:].strip()
    if not text.startswith("{"):
        return [], content, 0
    value, why = decode(text)
    call = _call_of(value) if why is None else None
    return ([call], None, 0) if call else ([], content, 0)
