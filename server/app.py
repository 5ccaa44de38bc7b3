"""gate's server where OpenEnv's layout of an environment puts it (`openenv validate .` looks here).

    uvicorn server.app:app --port 8000           # from the checkout: gate's module-level ASGI app
    python server/app.py [gate serve's flags]    # `gate serve`, as the `server` command is

Both names are the package's: `app` is gate_pipeline.integrations.openenv_app's (the one openenv.yaml
names, which works without the checkout) and `main` is `gate serve` (gate_pipeline.cli.start.main, the `server` console script).
"""
from __future__ import annotations

import sys

from gate_pipeline.cli.start import main as serve_main  # imports nothing of gate's until it runs (Ctrl-C: one line)


def __getattr__(name: str):
    """`app`, built on first use: `python server/app.py` serves what its flags say, not the default app."""
    if name == "app":
        from gate_pipeline.integrations.openenv_app import app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> int:
    """`gate serve` with this command's arguments."""
    return serve_main()


if __name__ == "__main__":
    sys.exit(main())
