"""Progress on stderr for long runs (rich), silent when stderr is not a terminal or the run is short.

The bar starts at the first step, not before: a batch that forks worker processes forks them
first, so no progress thread is running in the process being forked."""
from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, label: str):
    if total < 50 or not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import Progress
    prog = Progress(transient=True, console=Console(stderr=True))
    state = {}

    def advance():
        if not state:
            prog.start()
            state["task"] = prog.add_task(label, total=total)
        prog.advance(state["task"])
    try:
        yield advance
    finally:
        if state:
            prog.stop()
