"""The scripted server keeps the replies of its pure policies by conversation shape: a repeated
conversation (new call ids) gets the same answer without being re-read; the coin is never kept."""
from __future__ import annotations

import asyncio
import re

from gate_pipeline.model_agent.agent import ModelSettings
from gate_pipeline.model_agent.rollouts import run_rollouts
from scripted_server import ScriptedServer, _shape


def without_ids(record: dict) -> str:
    return re.sub(r"call_[0-9]+", "call_?", str(record["messages"]))


def test_a_repeated_conversation_is_answered_from_the_reply_cache_with_fresh_call_ids(eval_cases, tmp_path):
    with ScriptedServer() as server:
        settings = ModelSettings(model="careful", base_url=server.url)
        first = asyncio.run(run_rollouts(eval_cases[:1], settings, 1, 1, tmp_path / "a"))["records"][0]
        kept = dict(server.replies)
        again = asyncio.run(run_rollouts(eval_cases[:1], settings, 1, 1, tmp_path / "b"))["records"][0]
        assert kept and server.replies == kept and again["reward"] == first["reward"] == 1.0
        assert without_ids(again) == without_ids(first) and again["messages"] != first["messages"]
        coin = ModelSettings(model="coin", base_url=server.url)
        asyncio.run(run_rollouts(eval_cases[:1], coin, 1, 1, tmp_path / "c"))
        assert server.replies == kept and server.last_body["model"] == "coin"


def test_the_shape_renumbers_call_ids_in_order_and_keeps_which_result_answers_which_call():
    a = b'{"id": "call_7"}{"tool_call_id": "call_7"}{"id": "call_9"}'
    b = b'{"id": "call_3"}{"tool_call_id": "call_3"}{"id": "call_1"}'
    crossed = b'{"id": "call_3"}{"tool_call_id": "call_1"}{"id": "call_1"}'
    assert _shape(a) == _shape(b) != _shape(crossed)
