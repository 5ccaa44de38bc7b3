"""The opening of a model's conversation for one night of gate, and the nudge.

The system prompt is the suite's (`Suite.prompt`, in each suite's `prompt.py`): it states the job
and the stakes (irreversible loads, a loader that never complains, no report no credit) but never
the answer: the rules themselves are in the contract the model has to read.
"""
from __future__ import annotations

from ..kernel.suite import Suite

OPENING = "Tonight's batches are in staging. Begin."

NUDGE = ("No tool was called. Continue the night's work with the tools, and finish with "
         "submit_report(loaded, quarantined).")


def opening_messages(suite: Suite) -> list[dict]:
    """The conversation's start: the suite's system prompt (`Suite.prompt`) and the opening message."""
    return [{"role": "system", "content": suite.prompt}, {"role": "user", "content": OPENING}]
