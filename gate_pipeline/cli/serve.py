"""`gate serve`: gate as an OpenEnv server (HTTP and WebSocket), one episode per session.

    gate serve [--host 127.0.0.1] [--port 8000] [--cases FILE] [--max-sessions N]

Needs the `serve` extra (`pip install -e '.[serve]'`: openenv-core). `--port 0` picks a free port;
the first line printed says where it listens. Ctrl-C or SIGTERM stops it (exit 0); a busy port,
an unknown host or a bad case file is one line and exit 2.
"""
from __future__ import annotations

import sys

from ..kernel.settings import Settings
from .common import int_arg
from .errors import UsageError


def cmd_serve(a, settings: Settings) -> int:
    # gate serve never draws openenv-core's Gradio web UI, and importing Gradio costs seconds and
    # over 100 MB; openenv-core runs without it (its web interface is then None), so this process
    # tells Python that gradio is absent before importing openenv-core.
    if "gradio" not in sys.modules:
        sys.modules["gradio"] = None
    from ..kernel.pool import CasePool
    # a missing or malformed file is a CaseError: one line, in main (read before the server's imports)
    pool = CasePool.from_file(a.cases) if a.cases else CasePool.default(settings, "train")
    try:
        from ..integrations.openenv_server import serve
    except ModuleNotFoundError as exc:
        raise UsageError(f"gate serve needs openenv-core ({exc}); install it with pip install -e '.[serve]'") from None
    where = a.cases or "the train split"

    def ready(url: str) -> None:
        print(f"gate serve: {len(pool)} cases ({where}), up to {a.max_sessions} sessions, on {url} "
              f"(WebSocket {url.replace('http', 'ws', 1)}/ws); Ctrl-C stops it", flush=True)

    stopped_by = serve(pool, a.host, a.port, a.max_sessions, ready)
    print(f"gate serve: stopped ({stopped_by or 'the server exited'})", file=sys.stderr, flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve episodes over OpenEnv's protocol (HTTP and WebSocket)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int_arg("--port", 0, 65535), default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--cases", default=None, metavar="FILE", help="case file (default: the default suite's train "
                                                                  "split)")
    p.add_argument("--max-sessions", type=int_arg("--max-sessions"), default=64, metavar="N",
                   help="concurrent WebSocket sessions (default: 64)")
    p.set_defaults(fn=cmd_serve)
