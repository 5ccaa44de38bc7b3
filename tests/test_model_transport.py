"""The lean keep-alive transport against a real HTTP server: chunked bodies, close-delimited bodies,
stale pooled connections, timeouts mapped to the openai client's errors."""
from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import openai
import pytest
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from gate_pipeline.model_agent.transport import KeepAliveTransport

BODY = b'{"ok": true}'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path.endswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (BODY[:5], BODY[5:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.endswith("/close"):
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(BODY)
            self.close_connection = True
        elif self.path.endswith("/slow"):
            time.sleep(1.0)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
        else:  # keep-alive advertised, then the server drops the connection anyway
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
            self.close_connection = self.path.endswith("/stale")


@pytest.fixture(scope="module")
def base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", server
    server.shutdown()
    server.server_close()


def post_all(url, paths, timeout=5.0):
    async def go():
        transport = KeepAliveTransport()
        client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0,
                             http_client=DefaultAsyncHttpxClient(transport=transport))
        try:
            out = []
            for path in paths:
                r = await client.post(path, cast_to=httpx2.Response, content=b"{}", options={"timeout": timeout})
                out.append(r.json())
            return out, sum(len(p) for p in transport._idle.values())
        finally:
            await client.close()
    return asyncio.run(go())


def test_chunked_and_close_delimited_bodies(base):
    url, _ = base
    out, idle = post_all(url, ["/chunked", "/chunked", "/close", "/plain"])
    assert out == [{"ok": True}] * 4 and idle == 1


def test_a_stale_pooled_connection_is_retried_on_a_fresh_one(base):
    url, server = base
    server.seen.clear()
    out, _ = post_all(url, ["/stale", "/plain", "/stale", "/plain"])
    assert out == [{"ok": True}] * 4 and len(server.seen) == 4  # each request reached the server once


def test_a_read_timeout_is_the_clients_timeout_error(base):
    url, _ = base
    with pytest.raises(openai.APITimeoutError):
        post_all(url, ["/slow"], timeout=0.2)


def test_nothing_listening_is_a_connection_error():
    with pytest.raises(openai.APIConnectionError):
        post_all("http://127.0.0.1:9/v1", ["/plain"])
