"""The HTTP connections `gate serve` accepts: bounded, on time, and few per client.

uvicorn's own protocols hold whatever a client sends for as long as it sends it: with httptools (its
default where installed) a header line that never ends grows without limit and costs the event loop
more at each chunk, so one connection froze every session; and no protocol of uvicorn's closes a
request that never finishes arriving, so a client that sends half a request on each of thousands of
connections took every file descriptor. `gate serve` speaks HTTP through h11 instead, with:

- a request's head (its request line and headers) at most `MAX_HEAD_BYTES`, counted in the bytes sent
  (`HeadBoundConnection`): beyond it the connection gets **400** and is closed;
- `REQUEST_SECONDS` for a request to arrive whole, head and body, counted from the connection's
  opening or from the answer before it: a connection still sending a request then is closed (a
  request that has arrived takes as long as its answer takes; a WebSocket, once upgraded, is the
  session's business: its idle and stall timeouts);
- at most `CONNECTIONS_PER_CLIENT` connections open at once per client: one more is closed as it
  opens; and over all clients, what the process's open-files limit leaves (`connection_budget`: the
  limit, raised to its hard limit at start by `raise_open_files_limit`, less what the server opens
  itself for its sessions), of which one client holds at most half, so that neither one client nor
  many take the descriptors the server's own work needs or, at the usual limit of 1,024, every
  connection another client could make. A WebSocket counts until its socket is gone, whether its session was opened or refused
  (a refused one's closing handshake holds the socket for seconds); its session also counts against
  `--max-sessions` and `--max-per-client`.

A WebSocket that sends a message over its 1 MiB is failed by its protocol with close code 1009
("message too big"). uvicorn then closes the socket at once, while the client is still sending the rest of
its message: a socket closed with bytes unread is reset, and the reset loses the close frame sent just
before it, so the client saw a connection dropped without a reason. `ClosingWebSocket` sends the close
frame, then its end of the stream, and reads and drops what the client still sends for up to
`LINGER_SECONDS` before it drops the socket, sent or not (or until the client closes its end). A
lingering socket belongs to no session any more, so at most `LINGER_MAX` linger at once, over all
clients: beyond them a failed connection is closed at once, as uvicorn closes it.

A client, for these caps and for `--max-per-client`, is `client_key` of its address: the address, but an
IPv6 address (other than loopback) counts by its /64, since a host is given a /64 and picks addresses
from it at will. Each loopback address is a client of its own, as each machine's address is (the tests
stand other machines' clients on 127.0.0.2, 127.0.0.3): a user of this machine can take more places by
binding more of them (docs/serve.md).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any, Callable, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState

MAX_HEAD_BYTES = 16 * 1024
REQUEST_SECONDS = 10.0
CONNECTIONS_PER_CLIENT = 1024
RESERVED_DESCRIPTORS = 128  # the server's own: its listening socket, logs, imports, its first compile checks
SESSION_DESCRIPTORS = 4  # and a session's: a compile check's two pipes, a spilled database's file, a spare
LINGER_SECONDS = 2.0
LINGER_MAX = 64


# what uvicorn's HTTP protocol logs of a connection: its warnings are each a client's bad request (a head that
# does not parse, an upgrade it cannot make), as many as a client cares to send, so only errors are kept (they go
# where uvicorn's go: this logger is a child of its, its level set as each connection opens, since configuring
# uvicorn's logging resets its children's)
CLIENTS_LOG = logging.getLogger("uvicorn.error.gate_clients")


def client_key(host: str) -> str:
    """Who a connection is from, as the caps count clients (see the module docstring)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address) and not ip.is_loopback:
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def raise_open_files_limit() -> int:
    """Raise the process's open-files limit as far as its hard limit allows, and return the limit it then has
    (2**20 where it is unlimited)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        wants = [hard] if hard != resource.RLIM_INFINITY else [1 << 16, 10240]  # (10,240: macOS's OPEN_MAX)
        for want in wants:
            if want <= soft:
                break
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
                break
            except (ValueError, OSError):  # not allowed here: a lower one, or the limit as it is
                continue
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def connection_budget(open_files: int, sessions: int) -> int:
    """How many connections a process with an open-files limit of `open_files`, serving `sessions` sessions,
    can hold open at once over all clients: the limit less what the server opens itself
    (RESERVED_DESCRIPTORS, and SESSION_DESCRIPTORS a session)."""
    return max(0, open_files - RESERVED_DESCRIPTORS - SESSION_DESCRIPTORS * sessions)


class HeadBoundConnection(h11.Connection):
    """h11's server side, with a request's head bounded by the bytes it took to send, spaces and all.

    h11 stops a head still arriving once its buffer passes the limit, but one that arrived whole in a single
    read (up to the transport's read size) it parses, and the headers it gives back have lost the spaces
    that end a value, so neither they nor the limit tell how long the head was. What the buffer held before
    the request was read, less what it holds after, does. (`trailing_data` copies the buffer, which at a
    head's turn holds at most one read.)"""

    def next_event(self) -> Any:
        if self.their_state is not h11.IDLE:
            return super().next_event()
        before = len(self.trailing_data[0])
        event = super().next_event()
        if isinstance(event, h11.Request) and before - len(self.trailing_data[0]) > MAX_HEAD_BYTES:
            raise h11.RemoteProtocolError(f"the request's head is over {MAX_HEAD_BYTES // 1024} KiB",
                                          error_status_hint=400)
        return event


def protocol_class(request_seconds: float = REQUEST_SECONDS, per_client: int = CONNECTIONS_PER_CLIENT,
                   total: int | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the deadline and the caps above (`total`: over all clients, None for none);
    each server gets a class of its own (its counts of open connections are the class's)."""
    open_by_client: dict[str, int] = {}
    open_all = [0]

    class Bounded(H11Protocol):
        _key: str | None = None
        _timer: asyncio.TimerHandle | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = HeadBoundConnection(h11.SERVER, MAX_HEAD_BYTES)
            self.logger = CLIENTS_LOG
            if CLIENTS_LOG.level != logging.ERROR:  # (setting it clears every logger's cache)
                CLIENTS_LOG.setLevel(logging.ERROR)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            key = client_key(self.client[0] if self.client else "")
            if open_by_client.get(key, 0) >= per_client or (total is not None and open_all[0] >= total):
                transport.close()
                return
            self._key = key
            open_by_client[key] = open_by_client.get(key, 0) + 1
            open_all[0] += 1
            self._arm()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's 400, which sends a body: to a HEAD request (a head over the limit is refused once h11 has
            read its method) h11 refuses one, and the error escaped into asyncio's log. The head goes, then the
            connection."""
            try:
                super().send_400_response(msg)
            except h11.LocalProtocolError:
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._key is not None and not self.transport.is_closing():
                self._arm()  # the next request has as long from here

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._disarm()  # a session's now (its idle and stall timeouts); still this client's connection
            super().handle_websocket_upgrade(event)
            upgraded = self.transport.get_protocol()
            if upgraded is not self and isinstance(upgraded, ClosingWebSocket):
                upgraded.on_lost = self._release  # counted until its socket is gone, refused or lingering too
            else:
                self._release()

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(request_seconds, self._late)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _release(self) -> None:
            self._disarm()
            if self._key is not None:
                open_all[0] -= 1
                left = open_by_client[self._key] - 1
                if left:
                    open_by_client[self._key] = left
                else:
                    del open_by_client[self._key]
                self._key = None

        def _late(self) -> None:
            """A request still arriving when its time is up: the connection goes (an answer being made, or a
            connection that became a WebSocket, stays)."""
            self._timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self.transport.close()

    return Bounded


class ClosingWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (websockets' sans-I/O one), but a connection its protocol fails (a message
    over the size limit, a frame that breaks the protocol) gets its close frame: see the module docstring."""

    _failed = False
    lingering: ClassVar[set[ClosingWebSocket]] = set()  # of every server in the process (one, but for tests)
    on_lost: Callable[[], None] | None = None  # the HTTP connection's count of its client, released as it goes

    def send_receive_event_to_app(self) -> None:
        """A text message that is not UTF-8 is failed with 1007 (invalid data) as uvicorn fails it, but without the
        traceback uvicorn logs for each one (a loop of them filled the log)."""
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                self.frames = []
                try:
                    self.conn.send_close(1007)
                except InvalidState:  # the client's close frame came with it: the connection is closing already
                    pass
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()

    def data_received(self, data: bytes) -> None:
        if not self._failed:
            super().data_received(data)
        # else: failed, and closing: what the client still sends is dropped unread

    def handle_parser_exception(self) -> None:
        if self._failed:
            return
        self._failed = True
        sent = self.conn.close_sent
        self.queue.put_nowait({"type": "websocket.disconnect", "code": sent.code if sent else 1006,
                               "reason": sent.reason if sent else ""})
        self.transport.write(b"".join(self.conn.data_to_send()))  # the close frame
        self.close_sent = True
        if len(self.lingering) >= LINGER_MAX or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.lingering.add(self)
        self.transport.write_eof()  # after the close frame; the socket is still read
        if self.close_timer is not None:
            self.close_timer.cancel()
        # uvicorn's timer for a closing handshake (cancelled when the connection is lost; while it is set, the
        # application's end does not close the socket)
        self.close_timer = self.loop.call_later(LINGER_SECONDS, self._linger_over)

    def _linger_over(self) -> None:
        """The socket goes now, whatever is still unsent: a client that stops reading would keep a `close()`
        waiting for its buffer to drain (until the stall timeout), and its place among the lingering with it."""
        self.lingering.discard(self)
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lingering.discard(self)
        if self.on_lost is not None:
            self.on_lost, release = None, self.on_lost
            release()
        super().connection_lost(exc)
