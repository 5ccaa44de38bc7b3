"""`gate serve`'s lanes (integrations/openenv_lanes.py), without a server: a call that runs long is
moved off the normal-priority threads, the others keep finding one, and the long-running session's
next calls wait on the slow lane until they are short again."""
from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import pytest

pytest.importorskip("openenv.core", reason="needs the serve extra (openenv-core)")
from gate_pipeline.integrations import openenv_lanes  # noqa: E402
from gate_pipeline.integrations.openenv_lanes import Lanes  # noqa: E402

LONG = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) SELECT count(*) FROM c"


def long_query(n: int = 3_000_000):
    """CPU in SQLite (the GIL let go), as a budget-long query spends it; the thread's nice value."""
    sqlite3.connect(":memory:").execute(LONG.format(n=n)).fetchall()
    return threading.get_native_id()


def test_long_calls_move_off_the_fast_threads_and_a_short_call_never_waits_for_them():
    lanes = Lanes(threads=2, slice_s=0.02)

    async def main():
        slow = [asyncio.create_task(lanes.run(long_query, key=f"noisy-{i}")) for i in range(4)]  # twice the threads
        await asyncio.sleep(0.2)
        waits = []
        for _ in range(20):
            t = time.perf_counter()
            await lanes.run(lambda: 1, key="quiet")
            waits.append(time.perf_counter() - t)
        await asyncio.gather(*slow)
        return waits

    try:
        waits = asyncio.run(main())
    finally:
        lanes.shutdown()
    assert lanes.moved >= 2 and max(waits) < 0.1, (lanes.moved, max(waits))
    assert "quiet" not in lanes._heavy and {f"noisy-{i}" for i in range(4)} <= set(lanes._heavy)


@pytest.mark.skipif(not openenv_lanes.PER_THREAD_NICE, reason="per-thread priorities are Linux's")
def test_a_moved_call_runs_at_the_lowest_priority_and_its_session_queues_on_the_slow_lane(monkeypatch):
    import os
    monkeypatch.setattr(openenv_lanes, "REST", 0.0)  # no rest between slow calls: the test stays short
    lanes = Lanes(threads=1, slice_s=0.02)

    def priority_of_this_thread():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def main():
        first = await lanes.run(lambda: (long_query(), priority_of_this_thread())[1], key="s")
        queued = [await lanes.run(priority_of_this_thread, key="s") for _ in range(openenv_lanes.SHORT_TO_CLEAR)]
        back = await lanes.run(priority_of_this_thread, key="s")
        return first, queued, back

    try:
        first, queued, back = asyncio.run(main())
    finally:
        lanes.shutdown()
    assert first == openenv_lanes.LOW_PRIORITY  # moved while it ran
    assert set(queued) == {openenv_lanes.LOW_PRIORITY}  # the slow lane's thread
    assert back == os.getpriority(os.PRIO_PROCESS, 0) and "s" not in lanes._heavy  # short again: the fast lane


def test_an_error_in_a_call_reaches_its_caller_and_the_lanes_go_on():
    lanes = Lanes(threads=1, slice_s=0.02)

    async def main():
        with pytest.raises(ZeroDivisionError):
            await lanes.run(lambda: 1 / 0)
        return await lanes.run(lambda: "fine")

    try:
        assert asyncio.run(main()) == "fine"
    finally:
        lanes.shutdown()
