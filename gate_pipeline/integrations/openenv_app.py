"""gate's OpenEnv server as a module-level ASGI app, for any ASGI server and OpenEnv's tooling:

    uvicorn gate_pipeline.integrations.openenv_app:app [--host 127.0.0.1] [--port 8000]
    python -m gate_pipeline.integrations.openenv_app          # the same on 127.0.0.1:8000

It serves the default suite's train split (under GATE_CASES_DIR) with `gate serve`'s defaults.
With GATE_SERVE_TOKEN set, every request but `GET /health` must carry that token; without it,
the app answers only clients on its own machine (a request from elsewhere gets 401), since it
cannot know which address its server listens on. `gate serve` has the flags (other cases,
limits, --no-token, --trainer-state).
"""
from __future__ import annotations

import sys

if "gradio" not in sys.modules:  # openenv-core's optional web UI, never drawn here (see cli/serve.py)
    sys.modules["gradio"] = None  # type: ignore[assignment]

from ..kernel.pool import CasePool  # noqa: E402
from ..kernel.settings import Settings  # noqa: E402
from .openenv_server import ServeConfig, create_gate_app, serve  # noqa: E402

settings = Settings.from_env()  # this module is a server's entry point: the settings are resolved here, once
settings.register_suites()
pool = CasePool.default(settings, "train")
app = create_gate_app(pool, ServeConfig(token=settings.serve_token))


def main() -> None:
    """Serve `pool` on 127.0.0.1:8000 until Ctrl-C (`gate serve` takes the flags)."""
    serve(pool, "127.0.0.1", 8000, ServeConfig(token=settings.serve_token),
          ready=lambda url: print(f"gate serve: {len(pool)} cases on {url}; Ctrl-C stops it", flush=True))


if __name__ == "__main__":
    main()
