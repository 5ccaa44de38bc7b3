"""The scripted server keeps the replies of its pure policies by conversation shape: a repeated
conversation (new call ids) gets the same answer without being re-read; the coin is never kept."""
from __future__ import annotations

import asyncio
import re

from scripted_server import ScriptedServer, _shape

from gate_pipeline.kernel.settings import Settings
from gate_pipeline.model_agent.agent import ModelSettings
from gate_pipeline.model_agent.rollouts import read_transcripts, run_rollouts
from gate_pipeline.store import RunStore


def without_ids(transcript: dict) -> str:
    return re.sub(r"call_[0-9]+", "call_?", str(transcript["messages"]))


def rollout(cases, settings, run_dir, store) -> tuple[dict, dict]:
    """(the run's one record, its transcript line)."""
    record = asyncio.run(run_rollouts(cases, settings, 1, 1, run_dir, store))["records"][0]
    (line,) = [t for t in read_transcripts(run_dir / "transcripts.jsonl") if t["episode_id"] == record["episode_id"]]
    return record, line


def test_a_repeated_conversation_is_answered_from_the_reply_cache_with_fresh_call_ids(eval_cases, tmp_path):
    store = RunStore(Settings(home=tmp_path / "home"))
    with ScriptedServer() as server:
        settings = ModelSettings(model="scripted", base_url=server.url)
        first, first_line = rollout(eval_cases[:1], settings, tmp_path / "a", store)
        kept = dict(server.replies)
        again, again_line = rollout(eval_cases[:1], settings, tmp_path / "b", store)
        assert kept and server.replies == kept and again["reward"] == first["reward"] == 1.0
        assert without_ids(again_line) == without_ids(first_line) and again_line["messages"] != first_line["messages"]
        coin = ModelSettings(model="coin", base_url=server.url)
        rollout(eval_cases[:1], coin, tmp_path / "c", store)
        assert server.replies == kept and server.last_body["model"] == "coin"
    store.dispose()


def test_the_shape_renumbers_call_ids_in_order_and_keeps_which_result_answers_which_call():
    a = b'{"id": "call_7"}{"tool_call_id": "call_7"}{"id": "call_9"}'
    b = b'{"id": "call_3"}{"tool_call_id": "call_3"}{"id": "call_1"}'
    crossed = b'{"id": "call_3"}{"tool_call_id": "call_1"}{"id": "call_1"}'
    assert _shape(a) == _shape(b) != _shape(crossed)
