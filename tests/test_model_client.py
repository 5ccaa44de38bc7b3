"""GateOpenAI sends exactly what the stock AsyncOpenAI sends, keeps its retries and errors; the
transcript line spliced from already-encoded messages is exactly json.dumps of the record."""
from __future__ import annotations

import asyncio
import json

import httpx2
import openai
import pytest
from openai import AsyncOpenAI
from openai._models import FinalRequestOptions

from gate_pipeline.model_agent.agent import ModelSettings
from gate_pipeline.model_agent.client import GateOpenAI
from gate_pipeline.model_agent.rollouts import run_rollouts, transcript_line
from scripted_server import ScriptedServer

OPTIONS = {"headers": {"Content-Type": "application/json"}, "timeout": 60.0}


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


def options(content: bytes, **extra) -> FinalRequestOptions:
    return FinalRequestOptions.construct(method="post", url="/chat/completions", json_data=None, content=content,
                                         files=None, **{**OPTIONS, **extra})


def same(a: httpx2.Request, b: httpx2.Request) -> bool:
    return (a.method, a.url, a.headers.raw, a.content, a.extensions) == \
        (b.method, b.url, b.headers.raw, b.content, b.extensions)


def test_the_cached_request_shape_is_the_stock_clients_request():
    stock = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k1", max_retries=0)
    gate = GateOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k1", max_retries=0)
    for body in (b'{"a": 1}', b'{"messages": [' + b"x" * 5000 + b"]}", b"{}"):
        for retries in (0, 1, 2):
            assert same(gate._build_request(options(body), retries_taken=retries),
                        stock._build_request(options(body), retries_taken=retries))
    assert same(gate._build_request(options(b"{}", timeout=5.0)), stock._build_request(options(b"{}", timeout=5.0)))
    assert gate._build_request(options(b"{}"), retries_taken=2).headers["x-stainless-retry-count"] == "2"
    gate.api_key = stock.api_key = "k2"  # a new key is never served from the cache
    built = gate._build_request(options(b"{}"))
    assert built.headers["authorization"] == "Bearer k2" and same(built, stock._build_request(options(b"{}")))


def test_requests_the_cache_does_not_cover_go_through_openai_unchanged():
    stock = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    gate = GateOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    json_body = FinalRequestOptions.construct(method="post", url="/chat/completions", json_data={"model": "m"})
    assert same(gate._build_request(json_body), stock._build_request(json_body)) and not gate._shapes
    gate._client.cookies.set("session", "s1", domain="127.0.0.1")
    assert not gate._plain(options(b"{}"))


def test_post_bytes_keeps_the_clients_retries_and_status_errors(server):
    async def go():
        retrying = GateOpenAI(base_url=server.url, api_key="k", max_retries=1)
        plain = GateOpenAI(base_url=server.url, api_key="k", max_retries=0)
        try:
            body = json.dumps({"model": "silent", "messages": [{"role": "user", "content": "hi"}]}).encode()
            server.faults[:] = [500]
            before = server.requests["silent"]
            reply = (await retrying.post_bytes("/chat/completions", body, OPTIONS)).json()
            assert reply["choices"][0]["message"]["content"] and server.requests["silent"] == before + 2
            server.faults[:] = [429]
            with pytest.raises(openai.RateLimitError):
                await plain.post_bytes("/chat/completions", body, OPTIONS)
            with pytest.raises(openai.NotFoundError):
                await plain.post_bytes("/no/such/route", body, OPTIONS)
        finally:
            server.faults.clear()
            await retrying.close()
            await plain.close()
    asyncio.run(go())


def test_the_spliced_transcript_line_is_exactly_the_records_json(server, eval_cases, tmp_path):
    settings = ModelSettings(model="careful", base_url=server.url)
    out = asyncio.run(run_rollouts(eval_cases[:6], settings, 1, 3, tmp_path / "r"))
    written = (tmp_path / "r" / "transcripts.jsonl").read_text().splitlines()
    assert sorted(written) == sorted(json.dumps(r, default=str) for r in out["records"])
    record = dict(out["records"][0])
    assert transcript_line(record, []) == json.dumps(record, default=str)
    record["messages"] = record["messages"][:2]
    assert transcript_line(record, ["too", "many", "encodings"]) == json.dumps(record, default=str)


def test_a_run_collects_young_objects_less_often_and_puts_the_thresholds_back(server, eval_cases, tmp_path):
    import gc
    seen = []
    before = gc.get_threshold()
    settings = ModelSettings(model="careful", base_url=server.url)
    asyncio.run(run_rollouts(eval_cases[:2], settings, 1, 2, tmp_path / "g",
                             on_done=lambda record: seen.append(gc.get_threshold()[0])))
    assert seen == [max(before[0], 10_000)] * 2 and gc.get_threshold() == before
