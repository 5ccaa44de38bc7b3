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


def test_the_baton_lets_one_query_on_at_a_time_in_turns_and_a_waiter_never_past_its_deadline():
    from gate_pipeline.integrations.openenv_lanes import Baton, _Turn
    baton = Baton(turn_s=0.05)
    first, second, third = _Turn("a"), _Turn("b"), _Turn("c")  # three clients' queries
    far = time.monotonic() + 10
    assert baton.take(first, far) == 0.0  # free: taken at once
    seen = {}

    def query(turn, name, deadline, then=None):
        t = time.monotonic()
        waited = baton.take(turn, deadline)
        seen[name] = (time.monotonic() - t, baton._holder is turn, waited)
        if then is not None:
            then()

    t2 = threading.Thread(target=query, args=(second, "second", far, lambda: time.sleep(0.1)))
    t2.start()
    time.sleep(0.1)
    t3 = threading.Thread(target=query, args=(third, "third", time.monotonic() + 0.1))
    t3.start()
    t3.join()  # its deadline passed while `first` held the baton: it goes on without it
    assert seen["third"][0] < 0.1 + 0.05 and not seen["third"][1] and third not in baton._waiting
    t1 = threading.Thread(target=query, args=(first, "first again", far))
    t1.start()  # `first`'s turn is over and `second` waits: handed over; `first` waits for its next turn
    t2.join()
    assert seen["second"][1] and "first again" not in seen
    baton.give_up(second)  # the query ended: `first`, waiting since, has it
    t1.join()
    assert seen["first again"][1] and baton._holder is first
    baton.give_up(first)
    assert baton._holder is None and not baton._waiting
    for name, (took, _, waited) in seen.items():  # what each waited, as the sandbox is told it
        assert abs(waited - took) < 0.01, (name, took, waited)


def test_long_queries_moved_off_the_fast_threads_take_turns_and_keep_their_budget():
    """Four budget-long queries at once: once moved, one runs at a time (their progress checks come in runs
    of one thread's, a turn each, a turn's rest before each turn handed over), and each runs for its budget, its
    waits for its turn not counted: the four end within twice four budgets and a half, none before its own
    budget has passed."""
    from gate_pipeline.kernel.sandbox import Sandbox
    checks: list[tuple[float, int]] = []

    class Watched(Sandbox):
        def _progress(self):
            checks.append((time.monotonic(), threading.get_native_id()))
            return super()._progress()

    def budget_long():
        box = Watched(sqlite3.connect(":memory:", check_same_thread=False), step_budget=10**12, time_budget=0.8)
        t = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            box.execute(LONG.format(n=10**12))
        return time.monotonic() - t

    lanes = Lanes(threads=4, slice_s=0.02)

    async def main():
        return await asyncio.gather(*(lanes.run(budget_long, key=f"noisy-{i}") for i in range(4)))

    try:
        start = time.monotonic()
        took = asyncio.run(main())
    finally:
        lanes.shutdown()
    assert lanes.moved == 4 and 0.8 <= min(took) and max(took) <= 2 * 4 * 0.8 + 0.5, (lanes.moved, took)
    # once all four are moved (a slice of CPU each, on 4 threads: well within 0.3 s), they run in turns: the
    # checks change hands about once a turn (0.02 s), where four threads on their own interleave all the time
    late = [tid for t, tid in checks if t > start + 0.3]
    switches = sum(a != b for a, b in zip(late, late[1:]))
    assert switches <= 2 * (max(took) - 0.3) / 0.02 + 4, (switches, len(late))


def test_a_call_that_waits_without_cpu_is_moved_too_and_a_short_call_never_waits_for_it():
    """A call waiting on something else (a compile check's child compiles its statement for up to half a
    second) used no CPU, so it was never moved: sessions sending such statements held every fast thread, and a
    cheap step waited 1.6 s (outside review, 32 sessions). Past WALL_SLICES slices of wall time it is moved."""
    lanes = Lanes(threads=1, slice_s=0.02)

    async def main():
        waiting = asyncio.create_task(lanes.run(time.sleep, 1.0, key="waits"))
        await asyncio.sleep(0.05)  # it has the only fast thread
        t = time.perf_counter()
        await lanes.run(lambda: 1, key="quiet")
        took = time.perf_counter() - t
        await waiting
        return took

    try:
        took = asyncio.run(main())
    finally:
        lanes.shutdown()
    assert lanes.moved == 1 and "waits" in lanes._heavy and took < 0.5, (lanes.moved, took)


def test_a_session_back_from_a_long_call_is_never_queued_behind_other_sessions_long_calls(monkeypatch):
    """A session that ran one long query had its next cheap calls queued on the slow lane behind every other
    long-querying session's calls and the rests their threads took after them: 4 to 12 s a cheap step beside 8
    to 24 such sessions (outside review). The slow lane has a thread for each session that may use it, and a
    session rests after its own long call, no thread does."""
    lanes = Lanes(threads=2, slice_s=0.02, slow_threads=6)
    stop = False

    async def noisy(i):
        while not stop:  # long calls back to back, each on the slow lane once the first was moved
            await lanes.run(long_query, 1_500_000, key=f"noisy-{i}")

    async def main():
        loud = [asyncio.create_task(noisy(i)) for i in range(5)]
        await asyncio.sleep(1.0)  # every noisy session is on the slow lane, resting or running
        await lanes.run(long_query, 1_500_000, key="victim")  # moved: the victim is on the slow lane too
        waits = []
        for _ in range(openenv_lanes.SHORT_TO_CLEAR):
            t = time.perf_counter()
            await lanes.run(lambda: 1, key="victim")
            waits.append(time.perf_counter() - t)
        return waits, loud

    async def run_all():
        nonlocal stop
        waits, loud = await main()
        stop = True
        await asyncio.gather(*loud)
        return waits

    try:
        waits = asyncio.run(run_all())
    finally:
        lanes.shutdown()
    assert max(waits) < 0.25, waits


def test_one_clients_queries_end_oldest_first_not_all_at_their_deadline():
    """One client's long queries passed the baton round among them: each got a sixteenth of the turns, and sixteen
    queries of a second's work each all came to the end of their wait for turns together and all came back
    `interrupted`. Among one client's queries the oldest keeps its turn now, so they end one after another."""
    from gate_pipeline.integrations.openenv_lanes import Baton, _Turn
    baton = Baton(turn_s=0.01)
    far = time.monotonic() + 30
    queries = [_Turn("trainer") for _ in range(3)]
    assert baton.take(queries[0], far) == 0.0
    order, threads = [], []

    def wait_for_the_baton(turn, name):
        baton.take(turn, far)
        order.append(name)

    for k in (1, 2):
        threads.append(threading.Thread(target=wait_for_the_baton, args=(queries[k], k)))
        threads[-1].start()
        while queries[k] not in baton._waiting:
            time.sleep(0.001)
    time.sleep(0.03)  # the oldest's turn is over; at its next progress check it goes on
    assert baton.take(queries[0], far) == 0.0 and baton._holder is queries[0] and order == []
    other = _Turn("another client")  # a query of a client not served yet comes first, as before
    threads.append(threading.Thread(target=wait_for_the_baton, args=(other, "other")))
    threads[-1].start()
    while other not in baton._waiting:
        time.sleep(0.001)
    time.sleep(0.02)
    oldest = threading.Thread(target=baton.take, args=(queries[0], far))  # its turn over: handed over
    oldest.start()
    while order != ["other"]:
        time.sleep(0.001)
    baton.give_up(other)  # ended: the oldest of the trainer's again, not the one that waited longest
    oldest.join()  # (a query gives the baton up on its own thread, once its wait for it has returned)
    assert baton._holder is queries[0]
    baton.give_up(queries[0])
    while order != ["other", 1]:
        time.sleep(0.001)
    baton.give_up(queries[1])
    for thread in threads:
        thread.join()
    assert order == ["other", 1, 2]
    baton.give_up(queries[2])
    assert baton._holder is None and not baton._waiting


def test_the_baton_takes_turns_between_clients_not_queries():
    """Turns went to queries first come first served: a client with 56 sessions of long queries took 56 turns of
    every 57, and another client's one query waited past its 30 s and came back `interrupted`. Now the baton goes
    to the client served longest ago (first come first served among one client's queries)."""
    from gate_pipeline.integrations.openenv_lanes import Baton, _Turn
    baton = Baton(turn_s=0.01)
    far = time.monotonic() + 30
    noisy = [_Turn("noisy") for _ in range(4)]
    quiet = _Turn("quiet")
    assert baton.take(noisy[0], far) == 0.0
    order, threads = [], []

    def wait_for_the_baton(turn, name):
        baton.take(turn, far)
        order.append(name)

    for name, turn in [("noisy 1", noisy[1]), ("noisy 2", noisy[2]), ("noisy 3", noisy[3]), ("quiet", quiet)]:
        threads.append(threading.Thread(target=wait_for_the_baton, args=(turn, name)))
        threads[-1].start()
        while turn not in baton._waiting:  # queued in this order
            time.sleep(0.001)
    for k, turn in enumerate([noisy[0], quiet, noisy[1], noisy[2]]):
        baton.give_up(turn)  # each query ends as soon as it has its turn
        while len(order) < k + 1:
            time.sleep(0.001)
    baton.give_up(noisy[3])
    for thread in threads:
        thread.join()
    assert order == ["quiet", "noisy 1", "noisy 2", "noisy 3"]
    assert baton._holder is None and not baton._waiting
