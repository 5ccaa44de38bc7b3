"""A lean HTTP/1.1 keep-alive transport for the openai client, for plain-http local servers.

Measured (benchmarks/bench_rollouts.py): with the client's default transport most of a rollout's
CPU went to the HTTP stack (connection-pool bookkeeping, header validation, stream wrappers),
not to gate, capping a 2-vCPU machine well below 200 rollouts/s. This transport does the same
job for `http://` base URLs (vLLM, llama.cpp, Ollama, the scripted test server) with a pool of
asyncio stream connections: Content-Length or chunked bodies, keep-alive, one transparent
retry when a pooled connection turns out to have been closed by the server. Timeouts and
connection failures raise httpx2's own exceptions, so the openai client reports them as
APITimeoutError / APIConnectionError exactly as with its default transport. https:// base URLs
keep the default transport (TLS, proxies, HTTP/2).
"""
from __future__ import annotations

import asyncio

import httpx2

MAX_IDLE = 256


def _timeout(request: httpx2.Request, kind: str) -> float | None:
    value = (request.extensions.get("timeout") or {}).get(kind)
    return float(value) if value is not None else None


class _Closed(Exception):
    """The server closed a pooled connection before answering: safe to resend once."""


class KeepAliveTransport(httpx2.AsyncBaseTransport):
    def __init__(self, max_idle: int = MAX_IDLE):
        self._idle: dict[tuple[str, int], list] = {}
        self._max_idle = max_idle

    async def _connect(self, request, host, port):
        try:
            async with asyncio.timeout(_timeout(request, "connect")):
                return await asyncio.open_connection(host, port)
        except TimeoutError as exc:
            raise httpx2.ConnectTimeout(f"connect to {host}:{port} timed out", request=request) from exc
        except OSError as exc:
            raise httpx2.ConnectError(f"cannot connect to {host}:{port}: {exc}", request=request) from exc

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx2.UnsupportedProtocol(f"KeepAliveTransport serves http:// only, not {url.scheme}://")
        host, port = url.host, url.port or 80
        try:
            body = request.content  # already read (GateOpenAI builds requests with their body read)
        except httpx2.RequestNotRead:
            body = b"".join([part async for part in request.stream])
        target = url.raw_path.decode("ascii")
        lines = [f"{request.method} {target} HTTP/1.1".encode()]
        lines += [k + b": " + v for k, v in request.headers.raw if k.lower() != b"content-length"]
        lines.append(b"Content-Length: " + str(len(body)).encode())
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        pool = self._idle.setdefault((host, port), [])
        while pool:
            conn = pool.pop()
            try:
                return await self._exchange(request, conn, head + body, pool)
            except _Closed:
                continue  # stale keep-alive connection: try the next, then a fresh one
        conn = await self._connect(request, host, port)
        try:
            return await self._exchange(request, conn, head + body, pool)
        except _Closed as exc:
            raise httpx2.RemoteProtocolError("server closed the connection without answering",
                                              request=request) from exc

    async def _exchange(self, request, conn, data: bytes, pool: list) -> httpx2.Response:
        reader, writer = conn
        keep = False
        try:
            try:
                writer.write(data)
                async with asyncio.timeout(_timeout(request, "read")):
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")  # status line and headers in one read
                    except asyncio.IncompleteReadError as exc:
                        if not exc.partial:
                            raise _Closed() from exc
                        raise
                    status_line, *lines = head[:-4].split(b"\r\n")
                    status, headers = self._head(request, status_line, lines)
                    content, keep = await self._body(request, reader, headers)
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise _Closed() from exc
            except TimeoutError as exc:
                raise httpx2.ReadTimeout("timed out waiting for the server", request=request) from exc
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                raise httpx2.ReadError(f"bad response: {exc}", request=request) from exc
            return httpx2.Response(status, headers=headers, content=content, request=request,
                                   extensions={"http_version": b"HTTP/1.1"})
        finally:
            if keep and len(pool) < self._max_idle:
                pool.append(conn)
            else:
                writer.close()

    @staticmethod
    async def _header_lines(reader) -> list[bytes]:
        out = []
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return out
            out.append(line)

    @staticmethod
    def _head(request, status_line: bytes, lines: list[bytes]):
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP status line: {status_line[:80]!r}")
        headers = []
        for line in lines:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ValueError(f"not a header line: {line[:80]!r}")
            headers.append((name.strip(), value.strip()))
        return int(parts[1]), headers

    @staticmethod
    async def _body(request, reader, headers) -> tuple[bytes, bool]:
        values = {k.lower(): v.lower() for k, v in headers}
        keep = values.get(b"connection") != b"close"
        if b"chunked" in values.get(b"transfer-encoding", b""):
            chunks = []
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await KeepAliveTransport._header_lines(reader)  # trailers
                    return b"".join(chunks), keep
                chunks.append(await reader.readexactly(size))
                await reader.readline()
        if b"content-length" in values:
            return await reader.readexactly(int(values[b"content-length"])), keep
        if request.method == "HEAD":
            return b"", keep
        return await reader.read(), False  # body until the server closes

    async def aclose(self) -> None:
        for pool in self._idle.values():
            while pool:
                pool.pop()[1].close()
