"""`gate serve`: gate as an OpenEnv server (HTTP, WebSocket and MCP), one episode per session.

    gate serve [--host 127.0.0.1] [--port 8000] [--cases FILE] [--max-sessions N] [--max-per-client N]
               [--idle-timeout SECONDS] [--stall-timeout SECONDS] [--token TOKEN | --no-token]
               [--trainer-state]

Needs the `serve` extra (`pip install -e '.[serve]'`: openenv-core). `--port 0` picks a free port;
the first line printed says where it listens. An address other machines can reach needs a token
(`--token` or GATE_SERVE_TOKEN; `--no-token` serves anyone instead). Ctrl-C or SIGTERM stops it
(exit 0); a busy port, an unknown host, a public address without a token or a bad case file is
one line and exit 2.
"""
from __future__ import annotations

import sys

from ..kernel.settings import Settings
from .common import int_arg, positive_arg
from .errors import UsageError


def cmd_serve(a, settings: Settings) -> int:
    # gate serve never draws openenv-core's Gradio web UI, and importing Gradio costs seconds and
    # over 100 MB; openenv-core runs without it (its web interface is then None), so this process
    # tells Python that gradio is absent before importing openenv-core.
    if "gradio" not in sys.modules:
        sys.modules["gradio"] = None
    from ..kernel.pool import CasePool
    token = a.token if a.token is not None else settings.serve_token
    if a.no_token and token:
        raise UsageError("--no-token and a token (--token or GATE_SERVE_TOKEN) contradict each other")
    # a missing or malformed file is a CaseError: one line, in main (read before the server's imports)
    pool = CasePool.from_file(a.cases) if a.cases else CasePool.default(settings, "train")
    try:
        from ..integrations.openenv_server import ServeConfig, serve
    except ModuleNotFoundError as exc:
        raise UsageError(f"gate serve needs openenv-core ({exc}); install it with pip install -e '.[serve]'") from None
    where = a.cases or "the train split"
    config = ServeConfig(max_sessions=a.max_sessions, max_per_client=a.max_per_client, idle_timeout=a.idle_timeout,
                         stall_timeout=a.stall_timeout, token=token, remote_without_token=a.no_token,
                         trainer_state=a.trainer_state, request_timeout=a.request_timeout)

    def ready(url: str) -> None:
        guard = "token required" if token else ("no token: anyone who reaches the port" if a.no_token
                                                 else "no token: this machine only")
        print(f"gate serve: {len(pool)} cases ({where}), up to {a.max_sessions} sessions ({config.per_client} per "
              f"client, closed after {a.idle_timeout:g} s idle, dropped after {a.stall_timeout:g} s of answers not "
              f"taken), {guard}, on {url} "
              f"(WebSocket {url.replace('http', 'ws', 1)}/ws); Ctrl-C stops it", flush=True)

    stopped_by = serve(pool, a.host, a.port, config, ready)
    print(f"gate serve: stopped ({stopped_by or 'the server exited'})", file=sys.stderr, flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve episodes over OpenEnv's protocol (HTTP, WebSocket, MCP)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int_arg("--port", 0, 65535), default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--cases", default=None, metavar="FILE", help="case file (default: the default suite's train "
                                                                  "split)")
    p.add_argument("--max-sessions", type=int_arg("--max-sessions"), default=64, metavar="N",
                   help="concurrent sessions, WebSocket and MCP (default: 64)")
    p.add_argument("--max-per-client", type=int_arg("--max-per-client"), default=None, metavar="N",
                   help="concurrent sessions of one client address (default: --max-sessions)")
    p.add_argument("--idle-timeout", type=positive_arg("--idle-timeout"), default=300, metavar="SECONDS",
                   help="close a session after this long without a message (default: 300)")
    p.add_argument("--stall-timeout", type=positive_arg("--stall-timeout", 5, 86_400), default=60, metavar="SECONDS",
                   help="drop a connection whose client has left what it was sent untaken this long (5 to 86,400; "
                        "default: 60)")
    p.add_argument("--request-timeout", type=positive_arg("--request-timeout", 0.5, 3_600), default=10,
                   metavar="SECONDS", help="close an HTTP connection whose request has not arrived whole this long after "
                                           "it opened or after the answer before (0.5 to 3,600; default: 10)")
    p.add_argument("--token", default=None, help="the bearer token every request must carry (default: "
                                                 "GATE_SERVE_TOKEN; required on an address other machines reach)")
    p.add_argument("--no-token", action="store_true", help="serve clients on other machines without a token")
    p.add_argument("--trainer-state", action="store_true", help="without a token, serve state()'s trainer-only "
                                                                "fields (case id, rewards, grade) anyway")
    p.set_defaults(fn=cmd_serve)
