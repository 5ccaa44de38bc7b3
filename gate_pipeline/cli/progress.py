"""Progress on stderr for long runs (rich), silent when stderr is not a terminal or is short."""
from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, label: str):
    if total < 50 or not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import Progress
    with Progress(transient=True, console=None) as prog:
        task = prog.add_task(label, total=total)
        yield lambda: prog.advance(task)
