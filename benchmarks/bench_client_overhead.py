"""CPU per chat-completions request on the client side: where `gate run`'s HTTP time goes.

1. Against the scripted server (own process), 640 requests with 32 in flight: the openai client
   with its default transport vs with gate's KeepAliveTransport (model_agent/transport.py), and
   GateOpenAI (model_agent/client.py: the same client, each request shape built once) on top.
2. Against a transport that answers at once (no network, no server): the openai client's own
   request building, GateOpenAI's, and a bare httpx2 client, i.e. what the official client costs
   by itself.

    .venv/bin/python benchmarks/bench_client_overhead.py
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx2
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from gate_pipeline.model_agent.client import GateOpenAI  # noqa: E402
from gate_pipeline.model_agent.transport import KeepAliveTransport  # noqa: E402

BODY = json.dumps({"model": "silent", "messages": [{"role": "user", "content": "x" * 8000}]}).encode()
OPTIONS = {"headers": {"Content-Type": "application/json"}, "timeout": 60}


class Instant(httpx2.AsyncBaseTransport):
    """Answers every request at once with a fixed body: isolates the client's own cost."""

    async def handle_async_request(self, request):
        b"".join([part async for part in request.stream])
        return httpx2.Response(200, headers=[(b"content-type", b"application/json")], content=b'{"choices": []}',
                               request=request)


async def cpu_per_request(send, n: int, in_flight: int) -> float:
    for _ in range(20):
        await send()
    sem = asyncio.Semaphore(in_flight)

    async def one():
        async with sem:
            (await send()).json()
    start = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.process_time() - start) / n * 1e3


async def main() -> None:
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripted_server.py")], stdout=subprocess.PIPE,
                              text=True)
    try:
        url = server.stdout.readline().strip()
        default = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        lean = AsyncOpenAI(base_url=url, api_key="x", max_retries=0,
                           http_client=DefaultAsyncHttpxClient(transport=KeepAliveTransport()))
        gate = GateOpenAI(base_url=url, api_key="x", max_retries=0,
                          http_client=DefaultAsyncHttpxClient(transport=KeepAliveTransport()))
        print("client CPU per request (ms), 640 requests, 32 in flight, scripted server:")
        for label, client in (("openai client, default transport", default), ("openai client, KeepAliveTransport", lean)):
            ms = await cpu_per_request(lambda c=client: c.post("/chat/completions", cast_to=httpx2.Response,
                                                               content=BODY, options=OPTIONS), 640, 32)
            print(f"  {label:<40}{ms:>8.3f}")
        ms = await cpu_per_request(lambda: gate.post_bytes("/chat/completions", BODY, OPTIONS), 640, 32)
        print(f"  {'GateOpenAI, KeepAliveTransport':<40}{ms:>8.3f}")
    finally:
        server.terminate()
        server.wait()
    instant = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="x", max_retries=0,
                          http_client=DefaultAsyncHttpxClient(transport=Instant()))
    bare = httpx2.AsyncClient(transport=Instant())
    print("client CPU per request (ms), 2000 requests, a transport that answers at once:")
    ms = await cpu_per_request(lambda: instant.post("/chat/completions", cast_to=httpx2.Response, content=BODY,
                                                    options=OPTIONS), 2000, 1)
    print(f"  {'openai client (request building)':<40}{ms:>8.3f}")
    instant_gate = GateOpenAI(base_url="http://127.0.0.1:1/v1", api_key="x", max_retries=0,
                              http_client=DefaultAsyncHttpxClient(transport=Instant()))
    ms = await cpu_per_request(lambda: instant_gate.post_bytes("/chat/completions", BODY, OPTIONS), 2000, 1)
    print(f"  {'GateOpenAI (request building)':<40}{ms:>8.3f}")
    ms = await cpu_per_request(lambda: bare.post("http://127.0.0.1:1/v1/chat/completions", content=BODY,
                                                 headers={"Content-Type": "application/json"}), 2000, 1)
    print(f"  {'bare httpx2 client':<40}{ms:>8.3f}")


if __name__ == "__main__":
    asyncio.run(main())
