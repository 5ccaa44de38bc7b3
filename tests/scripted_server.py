"""A real chat-completions server on 127.0.0.1 that plays scripted policies, for tests and benchmarks.

It speaks the OpenAI chat-completions protocol over HTTP/1.1 (keep-alive) with the standard
library only. The policy is chosen by the request's `model`:

- `scripted` (or any name not below): reads the contract and the listing, checks each batch with gate's SQL rules
  (gate_pipeline.suites.classic.agents.sql_checks), customers first, loads or quarantines, reports.
  It is stateless like a model: every decision is derived from the conversation it is sent,
  and it uses parallel tool calls (4 requests for a two-batch case).
- `invalid-json`, `not-object`, `unknown-tool`, `missing-arg`, `mistyped-arg`, `no-tool-call`:
  the first reply is that kind of malformed output; then the careful policy.
- `silent`: never calls a tool.  `hang`: sleeps `hang_seconds` before answering.
- `garbage`: a 200 reply that is not a chat completion.
- `hermes-text`, `json-text`: the careful policy with its tool calls written in the reply's text, as a
  server without a tool parser returns them: Hermes `<tool_call>{...}</tool_call>` blocks (all of a
  turn's calls), or one bare JSON object `{"name": ..., "arguments": ...}` a reply.
- `lazy`: writes prose, unless the request's `tool_choice` is "required"; then careful.
- `report-then-load`: lists the batches, then in one reply reports them all loaded and loads them.
- `no-ids`, `same-id`: careful, its tool calls with no id, or all with the id "x".
- `surrogates`: careful, its text holding a lone surrogate (a JSON escape no UTF-8 can carry), and, at its
  first turn, one in a call's id and a call to a tool whose name holds one.
- every policy answers a request whose `tool_choice` is "none" with text only, as a real server does.
- `coin`: at its first turn picks, at random (seeded), to be careful or to load everything as
  listed without looking (it writes its plan in that turn's content and sticks to it): a
  policy with pass@1 near one half, to show what pass^k measures.
- `by-case`: careful on some cases, loading everything without looking on the others, decided by
  the case's first batch id: a pure function of the case (the same in any order and on any
  resume), with tables that are not all ones.

`server.faults` is a queue of HTTP statuses (e.g. [429, 500]) served, one per request, before
any policy answers. `GET /v1/models` lists the policies (`server.models_route = False`: 404, as a
server without that route); a request for one token (`max_tokens: 1`, the endpoint check's fallback)
gets "OK" and counts in `server.probes`. Run standalone: `python tests/scripted_server.py [--port N]`.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import random
import re
import socket
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gate_pipeline.kernel.agents import customers_first  # noqa: E402
from gate_pipeline.suites.classic.agents import sql_checks  # noqa: E402

MALFORMED = {
    "invalid-json": ("profile_batch", '{"batch_id": '),
    "not-object": ("list_batches", "[1, 2]"),
    "unknown-tool": ("drop_table", '{"table": "wh_orders"}'),
    "missing-arg": ("profile_batch", "{}"),
    "mistyped-arg": ("load_batch", '{"batch_id": 7}'),
}
_ids = itertools.count()


def _call(name: str, args) -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": f"call_{next(_ids)}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _history(messages: list) -> list[tuple[str, dict, object]]:
    """(tool, args, result) for every well-formed past call whose result was not an error."""
    results = {}
    for m in messages:
        if m.get("role") == "tool":
            try:
                results[m.get("tool_call_id")] = json.loads(m.get("content") or "null")
            except ValueError:
                results[m.get("tool_call_id")] = None
    out = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for tc in m.get("tool_calls") or []:
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except ValueError:
                continue
            result = results.get(tc["id"])
            if isinstance(args, dict) and not (isinstance(result, dict) and "error" in result):
                out.append((tc["function"]["name"], args, result))
    return out


def careful(messages: list) -> list[dict]:
    """The next tool calls of the careful policy, derived from the conversation so far."""
    past = _history(messages)
    by_tool = {name: result for name, _, result in past if name in ("read_contract", "list_batches")}
    if "read_contract" not in by_tool or "list_batches" not in by_tool:
        return [_call("read_contract", {}), _call("list_batches", {})]
    contract, listing = by_tool["read_contract"], by_tool["list_batches"]
    answers = {args["query"]: result for name, args, result in past if name == "run_sql"}
    decided = {args.get("batch_id") for name, args, _ in past if name in ("load_batch", "quarantine_batch")}
    calls, loaded, quarantined = [], [], []
    for batch in customers_first(listing):
        bid = batch["batch_id"]
        checks = sql_checks(batch["table"], batch["staging_table"], contract)
        if bid not in decided and any(q not in answers for _, _, q in checks):
            calls += [_call("run_sql", {"query": q}) for _, _, q in checks]
            return calls  # decisions so far, then this batch's checks, in one reply
        failing = next(((col, defect) for col, defect, q in checks if answers.get(q, {}).get("rows")), None)
        if failing:
            quarantined.append(bid)
            if bid not in decided:
                calls.append(_call("quarantine_batch", {"batch_id": bid, "column": failing[0],
                                                         "defect_type": failing[1]}))
        else:
            loaded.append(bid)
            if bid not in decided:
                calls.append(_call("load_batch", {"batch_id": bid}))
    return calls + [_call("submit_report", {"loaded": loaded, "quarantined": quarantined})]


def load_all(messages: list) -> list[dict]:
    """Load every batch in the order listed, without looking, and report it."""
    listing = next((r for name, _, r in _history(messages) if name == "list_batches"), [])
    ids = [b["batch_id"] for b in listing]
    return [_call("load_batch", {"batch_id": b}) for b in ids] + [
        _call("submit_report", {"loaded": ids, "quarantined": []})]


POLICIES = ("scripted", *MALFORMED, "no-tool-call", "silent", "hang", "garbage", "coin", "hermes-text", "json-text",
            "lazy", "report-then-load", "no-ids", "same-id", "surrogates")


def _as_text(call: dict) -> dict:
    return {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}


def _not_done(messages: list) -> dict:
    """The first of careful's next calls that has not been made (with a result) already."""
    done = {(name, json.dumps(args, sort_keys=True)) for name, args, _ in _history(messages)}
    calls = careful(messages)
    return next((c for c in calls if (c["function"]["name"], json.dumps(json.loads(c["function"]["arguments"]),
                                                                      sort_keys=True)) not in done), calls[-1])


def reply(model: str, messages: list, rng: random.Random | None = None, tool_choice=None) -> dict:
    """The assistant message the policy `model` sends next."""
    first = not any(m.get("role") == "assistant" for m in messages)
    if tool_choice == "none":
        return {"role": "assistant", "content": "I would call list_batches now."}
    if model == "hermes-text":
        text = "\n".join(f"<tool_call>\n{json.dumps(_as_text(c))}\n</tool_call>" for c in careful(messages))
        return {"role": "assistant", "content": "Next steps.\n" + text}
    if model == "json-text":
        return {"role": "assistant", "content": json.dumps(_as_text(_not_done(messages)))}
    if model == "lazy" and tool_choice != "required":
        return {"role": "assistant", "content": "Everything looks fine."}
    if model == "report-then-load":
        listing = next((r for name, _, r in _history(messages) if name == "list_batches"), None)
        if listing is None:
            return {"role": "assistant", "content": None, "tool_calls": [_call("list_batches", {})]}
        ids = [b["batch_id"] for b in listing]
        return {"role": "assistant", "content": None, "tool_calls": [
            _call("submit_report", {"loaded": ids, "quarantined": []}), *(_call("load_batch", {"batch_id": b}) for b in ids)]}
    if model == "coin":
        if first:
            plan = "careful" if (rng or random).random() < 0.5 else "quick"
            return {"role": "assistant", "content": f"plan: {plan}",
                    "tool_calls": [_call("read_contract", {}), _call("list_batches", {})]}
        plan = next(m.get("content") for m in messages if m.get("role") == "assistant")
        return {"role": "assistant", "content": None,
                "tool_calls": careful(messages) if plan == "plan: careful" else load_all(messages)}
    if model == "by-case":
        listing = next((r for name, _, r in _history(messages) if name == "list_batches"), None)
        if not listing:
            return {"role": "assistant", "content": None,
                    "tool_calls": [_call("read_contract", {}), _call("list_batches", {})]}
        quick = hashlib.sha256(str(listing[0].get("batch_id")).encode()).digest()[0] % 2
        return {"role": "assistant", "content": None, "tool_calls": load_all(messages) if quick else careful(messages)}
    if model in ("no-ids", "same-id"):
        calls = careful(messages)
        for c in calls:
            if model == "no-ids":
                del c["id"]
            else:
                c["id"] = "x"
        return {"role": "assistant", "content": None, "tool_calls": calls}
    if model == "surrogates":  # lone surrogates (JSON's escapes make them) in the text, a call's id and its name
        calls = careful(messages)
        if first:
            calls[0]["id"] += "\udc80"
            calls.append({"id": "y", "type": "function", "function": {"name": "list\ud800", "arguments": "{}"}})
        return {"role": "assistant", "content": "thinking \ud83d", "tool_calls": calls}
    if model == "flood" and first:  # a thousand calls in one reply
        return {"role": "assistant", "content": None, "tool_calls": [_call("list_batches", {}) for _ in range(1000)]}
    if model == "silent" or (model == "no-tool-call" and first):
        return {"role": "assistant", "content": "All batches look fine to me."}
    if model in MALFORMED and first:
        return {"role": "assistant", "content": None, "tool_calls": [_call(*MALFORMED[model])]}
    return {"role": "assistant", "content": None, "tool_calls": careful(messages)}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def setup(self):
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        status, body = models_answer(self.server, self.path)
        self._send(status, body)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        wait, status, body, headers = answer(self.server, self.path, raw)
        if wait:
            time.sleep(wait)
        self._send(status, body, headers)


CALL_ID = re.compile(rb'("(?:id|tool_call_id)": ?")call_[0-9]+"')
CALL_IDS = re.compile(rb'"(?:id|tool_call_id)": ?"(call_[0-9]+)"')
MODEL = re.compile(rb'"model": ?"([^"\\]*)"')
REPLY_CACHE_SIZE = 4096


def _shape(raw: bytes) -> tuple[bytes, tuple[int, ...]]:
    """The request without its call ids, and the ids renumbered in order of appearance: two
    conversations with the same shape differ only in the ids this server handed out, so the
    policies answer them alike."""
    order: dict[bytes, int] = {}
    return CALL_ID.sub(rb'\1#"', raw), tuple(order.setdefault(i, len(order)) for i in CALL_IDS.findall(raw))


UNCACHED = (b"coin", b"garbage", b"no-ids", b"same-id", b"surrogates")  # replies not kept: random, or ids of their own


def _fresh(cached: dict) -> dict:
    """A cached assistant message with new call ids, as the policy would have sent it."""
    out = {"role": "assistant", "content": cached["content"]}
    if "tool_calls" in cached:
        out["tool_calls"] = [_call(tc["function"]["name"], tc["function"]["arguments"]) for tc in cached["tool_calls"]]
    return out


def models_answer(state, path: str) -> tuple[int, dict]:
    """`GET /v1/models`: the policies, as a model server lists what it serves."""
    if path.rstrip("/") != "/v1/models" or not state.models_route:
        return 404, {"error": {"message": f"no route {path}"}}
    return 200, {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "gate-tests"}
                                            for name in POLICIES]}


PROBE = re.compile(rb'"max_tokens"\s*:\s*1\s*[,}]')


def answer(state, path: str, raw: bytes) -> tuple[float, int, dict, dict | None]:
    """(seconds to wait first, status, JSON body, extra headers) for one request; `state` is a server.

    The policies but `coin` are pure functions of the conversation, so their replies are kept by
    the conversation's shape (`_shape`): a model server that answers at once, without re-reading
    every earlier tool result on each request."""
    if path.rstrip("/") != "/v1/chat/completions":
        return 0.0, 404, {"error": {"message": f"no route {path}"}}, None
    if re.search(rb'"messages"\s*:\s*\[\s*\]', raw):  # as OpenAI: a request, not a conversation
        return 0.0, 400, {"error": {"message": "'messages' must contain at least one message"}}, None
    if PROBE.search(raw):  # one token: the endpoint check, answered without playing a policy
        with state.lock:
            state.probes += 1
            state.last_raw = raw
        return 0.0, 200, {"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
                          "model": "probe", "choices": [{"index": 0, "finish_reason": "length",
                                                         "message": {"role": "assistant", "content": "OK"}}]}, None
    found = MODEL.search(raw)
    shape = _shape(raw) if found and found.group(1) not in UNCACHED else None
    cached = state.replies.get(shape) if shape is not None else None
    if cached is not None:
        model = found.group(1).decode()
    else:
        try:
            body = json.loads(raw)
            model, messages, tool_choice = body["model"], body["messages"], body.get("tool_choice")
            if not isinstance(model, str):
                raise TypeError("model is not a string")
        except (ValueError, KeyError, TypeError):
            return 0.0, 400, {"error": {"message": "bad request body"}}, None
    with state.lock:
        state.requests[model] += 1
        state.last_raw = raw
        fault = state.faults.pop(0) if state.faults else None
        rng = random.Random(state.rng.random())
    if fault is not None:
        return 0.0, fault, {"error": {"message": f"scripted {fault}", "type": "server_error"}}, \
            ({"Retry-After": "0"} if fault == 429 else None)
    wait = state.hang_seconds if model == "hang" else state.delay
    if model == "garbage":
        return wait, 200, {"object": "not.a.completion"}, None
    if cached is not None:
        message = _fresh(cached)
    else:
        message = reply(model, messages, rng, tool_choice)
        if shape is not None and model.encode() == found.group(1):
            with state.lock:
                if len(state.replies) >= REPLY_CACHE_SIZE:
                    state.replies.clear()
                state.replies[shape] = message
    prompt_tokens = len(raw) // 4
    completion_tokens = len(json.dumps(message)) // 4
    return wait, 200, {
        "id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }, None


class _PolicyState:
    """What the policies share across requests: faults to serve, counts, the coin's seed."""

    def _init_state(self, hang_seconds: float, seed: int) -> None:
        self.lock = threading.Lock()
        self.faults: list[int] = []
        self.requests: Counter = Counter()
        self.last_raw: bytes | None = None
        self.replies: dict[tuple, dict] = {}  # assistant message by conversation shape (not coin's)
        self.hang_seconds = hang_seconds
        self.rng = random.Random(seed)
        self.delay = 0.0  # seconds before every answer (to interrupt a run mid-way in tests)
        self.models_route = True  # GET /v1/models answers (False: 404, a server without the route)
        self.probes = 0  # one-token requests answered (the endpoint check's fallback)

    @property
    def last_body(self) -> dict | None:
        """The last request's JSON body (parsed when asked: cached replies do not parse it)."""
        return json.loads(self.last_raw) if self.last_raw is not None else None


class ScriptedServer(_PolicyState, ThreadingHTTPServer):
    """`with ScriptedServer() as s:` serves on 127.0.0.1 in a thread; `s.url` is the base URL."""
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int = 0, hang_seconds: float = 5.0, seed: int = 0):
        super().__init__(("127.0.0.1", port), Handler)
        self._init_state(hang_seconds, seed)
        self._thread: threading.Thread | None = None

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return  # a client that timed out and hung up: expected in the timeout tests
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class AsyncScriptedServer(_PolicyState):
    """The same policies on one asyncio thread (no thread per connection): the benchmark's server,
    so that the server's own overhead takes as little as possible of the CPUs it shares."""

    def __init__(self, port: int = 0, hang_seconds: float = 5.0, seed: int = 0):
        self._init_state(hang_seconds, seed)
        self.port = port

    async def _connection(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ")[0]
                path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                raw = await reader.readexactly(length)
                if method == "GET":
                    (status, body), wait, headers = models_answer(self, path), 0.0, None
                else:
                    wait, status, body, headers = answer(self, path, raw)
                if wait:
                    await asyncio.sleep(wait)
                data = json.dumps(body).encode()
                extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
                writer.write(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n{extra}\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
            pass
        finally:
            writer.close()

    async def serve(self, ready=None) -> None:
        server = await asyncio.start_server(self._connection, "127.0.0.1", self.port, backlog=256)
        self.port = server.sockets[0].getsockname()[1]
        if ready:
            ready(f"http://127.0.0.1:{self.port}/v1")
        async with server:
            await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="seed of the coin policy")
    p.add_argument("--asyncio", action="store_true", help="one asyncio thread instead of a thread per connection")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before every answer (a slower model)")
    a = p.parse_args()
    if a.asyncio:
        try:
            asyncio.run(AsyncScriptedServer(a.port, seed=a.seed).serve(lambda url: print(url, flush=True)))
        except KeyboardInterrupt:
            pass
        return
    server = ScriptedServer(a.port, seed=a.seed)
    server.delay = a.delay
    print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
