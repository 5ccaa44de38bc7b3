"""Progress on stderr (rich), only on a terminal and never with --json: stdout stays the result.

`progress_bar` is advanced by the caller, once per case. The bar starts at the first step, not
before: a batch that forks worker processes forks them first, so no progress thread is running
in the process being forked. `polled_progress` is for work that runs where no callback reaches
(a Dagster job in process): a thread asks `count()` how far it is, every POLL_S seconds.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

POLL_S = 0.25


def shown(enabled: bool = True) -> bool:
    return enabled and sys.stderr.isatty()


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=True, console=Console(stderr=True))


@contextmanager
def progress_bar(total: int, label: str, enabled: bool = True):
    if not shown(enabled) or total <= 0:
        yield lambda: None
        return
    prog = _progress()
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


@contextmanager
def polled_progress(total: int, label: str, count, enabled: bool = True):
    """A bar for `total` steps whose progress `count()` reports (read in a thread of its own)."""
    if not shown(enabled) or total <= 0:
        yield
        return
    prog = _progress()
    done = threading.Event()

    def poll():
        task = prog.add_task(label, total=total)
        while not done.wait(POLL_S):
            try:
                prog.update(task, completed=min(count(), total))
            except Exception:  # noqa: BLE001 - progress is a courtesy: it never stops the work
                return
    prog.start()
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=2)
        prog.stop()
