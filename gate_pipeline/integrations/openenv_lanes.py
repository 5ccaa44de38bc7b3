"""Where `gate serve` runs its sessions' blocking work (steps, resets, closes): a few threads, and a
slow call never holds one of them up for long.

A step costs gate a fraction of a millisecond, but `run_sql` may run a query until the sandbox's
budget stops it (2 s of wall time; a v2 database's budget grows with its rows). On a plain pool,
eight such queries would take every thread and every CPU, and every other session would wait.
Here a call starts on one of `threads` threads at normal priority; while it runs the event loop
looks at the CPU time it has used every `slice_s` seconds, and once that passes `slice_s` the call
is *moved*: its thread's OS scheduling priority is lowered to the lowest (Linux `nice` 19, a
per-thread value there) and a new thread takes its place among the `threads`, so there are always
`threads` threads at normal priority for everyone else. A call that has run `WALL_SLICES` slices of
wall time is moved too, whatever CPU it used: a call waiting (on a compile check's child, say) holds
a thread as surely as one computing. The moved call still runs to its end (the sandbox stops it at
its budget, as in process); its thread then exits (a raised nice value cannot be lowered again
without privileges). Its session (the call's `key`) is marked: its next calls go to the *slow lane*,
`slow_threads` threads at the lowest priority (`gate serve` has one per session, so a call there
never waits for another session's to end), until `SHORT_TO_CLEAR` of them in a row are short. After
a call there that used more than a slice of CPU, the session's next call waits as long as that CPU
time before it starts (a duty cycle: the session rests, no thread does, so no other session waits for it).

*One long query at a time.* The queries of moved calls and of the slow lane take turns on one
*baton* (`Baton`): the sandbox's progress handler (`kernel.sandbox.pace`) holds a query that does
not have it, waiting without the GIL and without CPU, until its turn comes (a paced query's time is
its thread's CPU time, so neither its wait nor what runs beside it counts against its budget, up to
`kernel.sandbox.MAX_WAIT_S` of the clock beyond it: a query waiting then is stopped by its budget as
ever, `interrupted`); the holder passes it on after a turn of
`slice_s` seconds when others wait, to the client served longest ago (the oldest of that client's
queries: one client's queries end one after another), the next turn starting after a turn's rest. So the long queries of all sessions
together use at most one CPU, at the lowest priority. Why one at a time, when each runs in SQLite
without the GIL: a running query takes the GIL back at every progress check (every 1,000 SQLite
steps, about every 2 ms for string work), and a thread at the lowest priority that has asked for
the GIL makes the thread holding it wait until the OS gets round to running it; eight such queries
at once stalled the event loop and the step threads for tens of milliseconds at a time, one does
not. A session's SQL thus delays another session's step by about one slice, not by its budget;
the long-querying sessions share the baton (benchmarks/bench_serve.py's noisy-neighbours rows
measure both).

Where threads have no CPU clock or no per-thread priority (not Linux), a call is moved on wall time
and its thread keeps its priority: the others still find a free thread, but share the CPU with it.
"""
from __future__ import annotations

import asyncio
import collections
import os
import queue
import sys
import threading
import time
from typing import Any, Callable

from ..kernel import sandbox

LOW_PRIORITY = 19  # the largest nice value: runs on what CPU the others leave
REST = 1.0  # a session whose call on the slow lane ran long waits as long as that call's CPU time before its next
SHORT_TO_CLEAR = 10  # short calls in a row on the slow lane before a session's calls go to the fast lane again
WALL_SLICES = 10  # a call that has run this many slices of wall time is moved whatever CPU it used (a wait)
HANDOVER_REST = 1.0  # turns of rest before a turn handed over: the baton is idle as long as it is held, when shared
PER_THREAD_NICE = sys.platform.startswith("linux")


class _Worker:
    __slots__ = ("thread", "tid", "clock", "moved")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.tid = 0
        self.clock: int | None = None
        self.moved = False


class _Turn:
    """A query's place on the baton; `owner`, the client whose query it is (None: nobody's in particular);
    `started`, when the query under way first asked for the baton (0: none under way)."""

    __slots__ = ("granted", "since", "owner", "started")

    def __init__(self, owner: Any = None) -> None:
        self.granted = threading.Event()
        self.since = 0.0
        self.owner = owner
        self.started = 0.0


class Baton:
    """One long query runs at a time; the others wait for their turn at their progress checks (in a wait
    that holds neither the GIL nor a CPU), a turn being `turn_s` seconds while others wait. The next turn is
    the waiting query of the client (`_Turn.owner`) served longest ago, the oldest first among one client's:
    a client with many sessions of long queries gets a turn as often as a client with one, and its own
    queries end one after another, oldest first. (Passed round among them, every one of sixteen queries of a
    second's work each came to the end of its wait for turns together, and all sixteen came back
    `interrupted`.) A query still waiting at the deadline it gives goes on (and is stopped by its budget)."""

    OWNERS = 4096  # clients whose last turn is remembered (then those with no query waiting are forgotten)

    def __init__(self, turn_s: float):
        self.turn_s = turn_s
        self._lock = threading.Lock()
        self._holder: _Turn | None = None
        self._waiting: collections.deque[_Turn] = collections.deque()
        self._served: dict[Any, int] = {}  # owner -> the number of the last turn it was given
        self._turns = 0

    def take(self, turn: _Turn, deadline: float) -> float:
        """Return when `turn` has the baton, or at `deadline`; the seconds it waited."""
        with self._lock:
            if not turn.started:
                turn.started = time.monotonic()
            if self._holder is turn:
                if not self._waiting or time.monotonic() - turn.since < self.turn_s:
                    return 0.0  # its turn goes on
                if self._rank(turn) <= self._rank(self._next()):  # still the one whose turn it would be
                    turn.since = time.monotonic()
                    return 0.0
                self._pass_on()
            elif self._holder is None and not self._waiting:
                self._grant(turn)
                return 0.0
            turn.granted.clear()
            self._waiting.append(turn)
        start = time.monotonic()
        turn.granted.wait(max(0.0, deadline - start))
        with self._lock:
            handed = self._holder is turn
            if not handed:  # the deadline came first: out of the queue
                self._waiting.remove(turn)
        if handed:  # a turn handed over starts after a turn's rest, the baton held and idle: long queries that
            # take turns use at most half a CPU between them, and take the GIL at their progress checks half as often
            time.sleep(max(0.0, min(self.turn_s * HANDOVER_REST, deadline - time.monotonic())))
            with self._lock:
                turn.since = time.monotonic()  # its turn starts now
        return time.monotonic() - start

    def give_up(self, turn: _Turn) -> None:
        """The query ended (its turn's next query, if any, is another)."""
        with self._lock:
            turn.started = 0.0
            if self._holder is turn:
                self._pass_on()

    def _rank(self, turn: _Turn) -> tuple[int, float]:
        """Whose turn comes first: the client served longest ago, then the oldest query."""
        return self._served.get(turn.owner, 0), turn.started

    def _next(self) -> _Turn:
        return min(self._waiting, key=self._rank)  # of equals, the first in the queue

    def _pass_on(self) -> None:
        self._holder = None
        if self._waiting:
            turn = self._next()
            self._waiting.remove(turn)
            self._grant(turn)
            turn.granted.set()

    def _grant(self, turn: _Turn) -> None:
        self._turns += 1
        if len(self._served) >= self.OWNERS:
            waiting = {t.owner for t in self._waiting}
            self._served = {o: n for o, n in self._served.items() if o in waiting}
        self._served[turn.owner] = self._turns
        self._holder, turn.since = turn, time.monotonic()


class _Pacer:
    """A lane thread's pacer (`kernel.sandbox.pace`): a fast thread's queries run freely until its call is
    moved, then on the baton; the slow lane's always on the baton."""

    __slots__ = ("baton", "worker", "turn")

    def __init__(self, baton: Baton, worker: _Worker | None):
        self.baton, self.worker, self.turn = baton, worker, _Turn()

    def wait(self, deadline: float) -> float:
        if self.worker is None or self.worker.moved:
            return self.baton.take(self.turn, deadline)
        return 0.0

    def done(self) -> None:
        self.baton.give_up(self.turn)


class _Call:
    __slots__ = ("fn", "args", "future", "loop", "worker", "cpu0", "wall0", "done", "key", "owner")

    def __init__(self, fn, args, future, loop, owner=None) -> None:
        self.fn, self.args, self.future, self.loop = fn, args, future, loop
        self.worker: _Worker | None = None
        self.cpu0 = self.wall0 = 0.0
        self.done = False
        self.key = None
        self.owner = owner  # the client whose call it is: its queries' turns on the baton are that client's


def _settle(future: asyncio.Future, result, error) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Lanes:
    """`await lanes.run(fn, *args)`: fn(*args) on a worker thread; see the module's docstring."""

    def __init__(self, threads: int = 8, slice_s: float = 0.05, name: str = "gate-step", slow_threads: int = 1,
                 nice_moved: bool = True):
        if threads < 1 or slow_threads < 1 or slice_s <= 0:
            raise ValueError("lanes need at least one thread each and a positive slice")
        self.threads, self.slice_s, self.name, self.nice_moved = threads, slice_s, name, nice_moved
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._slow_calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._fast: set[_Worker] = set()
        self._heavy: dict = {}  # key (a session) whose call was moved -> its short calls on the slow lane since
        self._rest_until: dict = {}  # key -> when its next call may start (after a long call on the slow lane)
        self._closed = False
        self.moved = 0  # calls moved to the slow lane so far
        self.baton = Baton(slice_s)
        for _ in range(threads):
            self._spawn()
        self._slow_workers = [threading.Thread(target=self._work_slow, name=f"{name}-slow", daemon=True)
                              for _ in range(slow_threads)]
        for thread in self._slow_workers:
            thread.start()

    # -- the workers ------------------------------------------------------------------------------
    def _spawn(self) -> None:
        worker = _Worker()
        worker.thread = threading.Thread(target=self._work, args=(worker,), name=self.name, daemon=True)
        self._fast.add(worker)
        worker.thread.start()

    def _work(self, worker: _Worker) -> None:
        worker.tid = threading.get_native_id()
        pacer = _Pacer(self.baton, worker)
        sandbox.pace(pacer)
        try:
            worker.clock = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):  # no per-thread CPU clock here: calls are timed on the wall clock
            worker.clock = None
        while True:
            call = self._calls.get()
            if call is None:
                return
            with self._lock:
                call.worker, call.cpu0, call.wall0 = worker, time.thread_time(), time.monotonic()
            pacer.turn.owner = call.owner
            try:
                result, error = call.fn(*call.args), None
            except BaseException as exc:  # noqa: BLE001  (handed to the caller, as an executor does)
                result, error = None, exc
            with self._lock:
                call.done = True
                moved = worker.moved
            try:
                call.loop.call_soon_threadsafe(_settle, call.future, result, error)
            except RuntimeError:  # the loop is closed: the server stopped while this call ran
                pass
            if moved:
                return  # a thread moved to the slow lane leaves; another took its place

    def _work_slow(self) -> None:
        """The slow lane: the calls of sessions whose last call ran long, one at a time per thread, at the
        lowest priority (the thread is the lane's for good, so its priority never needs raising again)."""
        if self.nice_moved and PER_THREAD_NICE:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOW_PRIORITY)
            except OSError:
                pass
        pacer = _Pacer(self.baton, None)
        sandbox.pace(pacer)
        while True:
            item = self._slow_calls.get()
            if item is None:
                return
            call, key = item
            pacer.turn.owner = call.owner
            cpu0 = time.thread_time()
            try:
                result, error = call.fn(*call.args), None
            except BaseException as exc:  # noqa: BLE001
                result, error = None, exc
            used = time.thread_time() - cpu0
            with self._lock:
                if key in self._heavy:
                    short = used < self.slice_s
                    self._heavy[key] = self._heavy[key] + 1 if short else 0
                    if self._heavy[key] >= SHORT_TO_CLEAR:  # short again for a while: back to the fast lane
                        del self._heavy[key]
                    if not short:  # a duty cycle: the long queries' share of the CPU stays small. The session
                        # rests, not the thread: another session's call never waits for it
                        self._rest_until[key] = time.monotonic() + min(REST * used, 30.0)
            call.done = True
            try:
                call.loop.call_soon_threadsafe(_settle, call.future, result, error)
            except RuntimeError:
                pass

    # -- the event loop's side --------------------------------------------------------------------
    async def run(self, fn: Callable[..., Any], *args: Any, key=None, owner=None) -> Any:
        """fn(*args) on a thread; `key` (a session) names whose calls these are: once one of its calls
        ran past a slice, its next calls wait on the slow lane until one of them is short again. `owner` (a
        client) is whose turns its long queries take on the baton."""
        if self._closed:
            raise RuntimeError("the server is stopping")
        loop = asyncio.get_running_loop()
        call = _Call(fn, args, loop.create_future(), loop, owner)
        call.key = key
        if key is not None and key in self._heavy:
            rest = self._rest_until.pop(key, 0.0) - time.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)
            self._slow_calls.put((call, key))
            return await call.future
        self._calls.put(call)
        handle = loop.call_later(self.slice_s, self._look, call)
        try:
            return await call.future
        finally:
            handle.cancel()
            if call.worker is None or not call.done:  # still queued or running: look no more
                call.done = True

    def _look(self, call: _Call) -> None:
        """Every slice while the call runs: move it once it has used a slice of CPU."""
        with self._lock:
            worker = call.worker
            if call.done:
                return
            if worker is None:  # still queued (every fast thread busy): look again later
                used = 0.0
            elif worker.clock is not None and time.monotonic() - call.wall0 < WALL_SLICES * self.slice_s:
                used = time.clock_gettime(worker.clock) - call.cpu0
            else:  # or no CPU clock here; or it has waited long, on CPU or not (a compile check's child)
                used = time.monotonic() - call.wall0
            if worker is None or used < self.slice_s:
                call.loop.call_later(self.slice_s, self._look, call)
                return
            worker.moved = True
            self._fast.discard(worker)
            self.moved += 1
            if call.key is not None:
                self._heavy[call.key] = 0
            if not self._closed:
                self._spawn()
        if self.nice_moved and PER_THREAD_NICE and worker.clock is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, worker.tid, LOW_PRIORITY)
            except OSError:  # the thread has just ended, or the system refuses: it keeps its priority
                pass

    def forget(self, key) -> None:
        """A session has ended: its key means nothing any more."""
        with self._lock:
            self._heavy.pop(key, None)
            self._rest_until.pop(key, None)

    def shutdown(self) -> None:
        """Stop the fast threads once they are idle (calls in flight end on their own; daemon threads)."""
        with self._lock:
            self._closed = True
            count = len(self._fast)
        for _ in range(count):
            self._calls.put(None)
        for _ in self._slow_workers:
            self._slow_calls.put(None)
