"""Cases played in forked worker processes (`engine.play_cases(..., workers=N)`): each worker a contiguous share,
its results sent back to the parent, which puts them together in case order. A batch ends as it does in one
process, whatever the case file or the agent does, and leaves no worker, pipe or descriptor behind."""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import time
from typing import Any

from .cases import CaseLines, contiguous
from .compile_check import close_all as close_compile_checks
from .compile_check import warm as warm_compile_checks
from .errors import GateError
from .records import EpisodeResult, log_text

# what a forked worker plays: set before the workers fork, so nothing but share bounds and results is pickled
_JOBS: dict[int, tuple] = {}


class WorkerDied(GateError, RuntimeError):
    """A worker process playing cases ended without answering (killed, out of memory, or ended by its agent)."""


def _worker_start(parent: int) -> None:
    """A worker ends with the process that forked it (Linux's parent-death signal, SIGKILL: an agent that handles
    SIGTERM could catch that one): a parent stopped by a signal it does not handle (SIGTERM, SIGKILL) leaves no
    worker playing on for nobody."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent went before the signal was asked for (not `== 1`: gate may be PID 1)
        os._exit(1)


_TICK, _DONE, _FAILED = "tick", "done", "failed"


class WorkerTraceback(Exception):
    """Where in a worker process an exception was raised: its traceback as the worker formatted it (the
    `__cause__` of what the parent raises again)."""


def _sendable(exc: BaseException) -> BaseException:
    """`exc` if it survives the trip to the parent (pickled, then rebuilt), else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - a class that does not pickle or cannot be rebuilt from its args
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _log_to_send(log: Any) -> Any:
    """An agent's log as the parent can read it back: itself when it pickles and unpickles, else as the run store
    keeps it (`log_text`), as the JSON value that text is where that pickles (a list nested a thousand deep does
    not), else as `{"log": text}`."""
    def reads_back(value: Any) -> bool:
        try:
            pickle.loads(pickle.dumps(value))
            return True
        except BaseException:  # noqa: BLE001 - whatever an agent's pickling hooks raise, SystemExit included
            return False
    if reads_back(log):
        return log
    text = log_text(log)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {"log": text}
    return value if reads_back(value) else {"log": text}


def _results_message(results: dict[str, list[EpisodeResult]]) -> memoryview:
    """A worker's results as the message the parent's `recv` reads, pickled once, before any of it is written. The
    agents' logs are whatever the agents returned: where there are any, the message is read back here (where the
    same classes are) as the parent will read it, and if it does not read back, each log goes as `_log_to_send`
    makes it, so the batch ends as it does in one process (a log can pickle and not unpickle: an exception whose
    `__init__` takes two arguments)."""
    from multiprocessing.reduction import ForkingPickler  # what Connection.send pickles with
    logs = [r for played in results.values() for r in played if r.agent_log is not None]
    try:
        message = ForkingPickler.dumps((_DONE, results))
        if logs:
            pickle.loads(message)
        return message
    except BaseException:  # noqa: BLE001 - whatever an agent's pickling hooks raise; a Ctrl-C reaches the parent too
        pass
    for result in logs:
        result.agent_log = _log_to_send(result.agent_log)
    try:
        return ForkingPickler.dumps((_DONE, results))
    except Exception as exc:  # noqa: BLE001 - a result that is not the agent's log
        raise GateError(f"a worker process could not send its results ({type(exc).__name__}: {exc}"[:300]
                        + "); play this batch with --workers 1") from None


def _worker(job: int, start: int, stop: int, link, inherited: list, parent: int) -> None:
    """A forked worker's life: its share of the cases played, each case's end told (when the caller asked for
    progress), then its results sent. A share of a case file's lines is parsed and checked first, what was
    made of it sent, and played only once the parent, having every share's, says the whole file is good.
    `inherited`: the parent's ends of the pipes forked so far, this one's included, closed here (so the
    worker sees the parent go, and holds no descriptor it does not use). Whatever the share raises goes to
    the parent, which raises it again (a KeyboardInterrupt an agent raised too, as one process would say it)."""
    code, writing = 0, False
    try:
        for end in inherited:  # the parent's ends of the pipes, and what it watches the other workers by
            if isinstance(end, int):
                os.close(end)
            else:
                end.close()
        _worker_start(parent)
        warm_compile_checks(1)  # this process's own child, started while its share is parsed
        play, cases, specs, reward, run_id, ticks = _JOBS[job]
        if isinstance(cases, CaseLines):
            share = cases.share(start, stop)
            mine, share.cases = share.cases, []  # the parent needs the ids, not the cases
            if share.error is not None:
                share.error = _sendable(share.error)
            link.send(share)
            if not link.recv():
                return
        else:
            mine = cases[start:stop]
        tick = (lambda: link.send((_TICK, None))) if ticks else None
        message = _results_message(play(mine, specs, reward=reward, run_id=run_id, progress=tick))
        writing = True
        link.send_bytes(message)
    except BaseException as exc:  # the parent raises it, with where it was raised here
        import traceback
        code = 1
        try:
            if not writing:  # (a message cut short by Ctrl-C, followed by another, would be read as one)
                link.send((_FAILED, (_sendable(exc), "".join(traceback.format_exception(exc)))))
        except BaseException:  # noqa: BLE001 - the parent gone (a Ctrl-C of the whole group: it says so itself)
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):  # what an agent printed here
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream closed or gone
                pass
        try:
            close_compile_checks()  # its children reaped here, not left as zombies for whoever inherits them
        except BaseException:  # noqa: BLE001 - Ctrl-C meanwhile: the worker ends all the same
            pass
        os._exit(code)  # not the interpreter's teardown of a forked copy of the parent's heap


def _ended(process) -> Any:
    """What the parent waits on to learn that a worker process has ended: a descriptor of the process itself
    (Linux's pidfd), not its pipe, which a process the agent forked may hold open long after (the process's
    sentinel where there is no pidfd: a pipe too)."""
    try:
        return os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return process.sentinel


def _watch(ended, link, stop: int) -> None:
    """A thread of the parent's, one per worker: once the worker process has ended (`ended`), the reading side of
    its pipe is shut, so the parent reads what the worker sent and then the end of the file, even while a process
    the agent forked holds the pipe open (a read of a message the worker died sending would otherwise wait for that
    process for ever). Returns at once when `stop` is readable (the batch is over)."""
    from multiprocessing.connection import wait
    if stop in wait([ended, stop]):
        return
    try:  # the pipe's own descriptor (no dup, which may find none free), open until the watchers are joined
        end = socket.socket(fileno=link.fileno())
    except OSError:  # not a socket (a platform's pipe)
        return
    try:
        end.shutdown(socket.SHUT_RD)  # what is in the pipe is still read; then EOF
    except OSError:
        pass
    finally:
        end.detach()  # the descriptor is the Connection's to close


def _how_it_ended(process) -> str:
    """A worker's end as the parent can tell it: its exit code, or the signal that killed it. (Not `join`, whose
    timeout waits on the process's sentinel, a pipe a process the agent forked may hold.)"""
    deadline = time.monotonic() + 5
    while (code := process.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if code is None:
        return "it closed its end of the pipe and is still running"
    if code >= 0:
        return f"its exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name}" + (", perhaps out of memory" if -code == signal.SIGKILL else "")


def play_forked(play, cases, specs, reward, run_id, progress, workers) -> dict[str, list[EpisodeResult]]:
    """The cases in `workers` forked processes, each a contiguous share, the results put together in case
    order. A case file's lines (`CaseLines`) are checked first, every worker its share, and nothing is played
    until every share is good: a bad line is refused as `read_cases` refuses it, before anything is played.
    `play` plays a share in a worker, in one process (`engine.play_cases`, which calls this)."""
    from multiprocessing.connection import wait
    context = multiprocessing.get_context("fork")
    lines = isinstance(cases, CaseLines)
    bounds = cases.bounds(workers) if lines else contiguous(len(cases), workers)
    job = id(cases)
    _JOBS[job] = (play, cases, specs, reward, run_id, progress is not None)
    links: list[tuple] = []  # (process, the parent's end of its pipe, its share's bounds, what says it ended)
    stop: tuple[int, int] | None = None
    watchers: list[threading.Thread] = []

    def died(k: int) -> WorkerDied:
        process, _, share, _ = links[k]
        what, first, last = ("lines", share[0] + 1, cases.line_number(share[1])) if lines else \
            ("cases", share[0] + 1, share[1])
        return WorkerDied(f"a worker process ended without answering ({_how_it_ended(process)}) while its share, "
                          f"{what} {first}-{last}, was being read or played; nothing of this batch is kept")

    def answer(k: int) -> Any:
        """Worker k's next message, once it is there (a failure it sends is raised here); WorkerDied if the worker
        ended without one."""
        _, link, _, ended = links[k]
        if link not in wait([link, ended]) and not link.poll(0):
            raise died(k)
        try:
            message = link.recv()
        except (EOFError, OSError):
            raise died(k) from None
        except Exception as unread:  # noqa: BLE001 - what it sent does not unpickle here (an agent log's object)
            raise GateError(f"a worker process sent what cannot be read back ({type(unread).__name__}: {unread}"[:300]
                            + "); play this batch with --workers 1") from None
        if isinstance(message, tuple) and message[0] == _FAILED:
            exc, where = message[1]
            del message
            try:
                raise exc from WorkerTraceback(where)
            finally:
                del exc  # not kept in this frame: a caller holding the exception would hold every worker's pipe
        return message

    try:
        try:
            for share in bounds:
                here, there = context.Pipe()
                inherited = [end for _, end, _, _ in links] + [here] + \
                    [ended for process, _, _, ended in links if isinstance(ended, int) and ended != process.sentinel]
                process = context.Process(target=_worker, args=(job, *share, there, inherited, os.getpid()),
                                          daemon=True)
                links.append((process, here, share, None))
                process.start()
                links[-1] = (process, here, share, _ended(process))
                there.close()
            stop = os.pipe()  # for the watchers, started once every worker is forked: no fork while they run
            for _, here, _, ended in links:
                watchers.append(threading.Thread(target=_watch, args=(ended, here, stop[0]), name="gate-worker-watch",
                                                 daemon=True))
                watchers[-1].start()
        except (OSError, RuntimeError) as exc:  # out of file descriptors, processes or threads
            raise GateError(f"could not start {workers} worker processes ({getattr(exc, 'strerror', None) or exc}); "
                            "ask for fewer (--workers)") from None
        if lines:
            ids: set[str] = set()
            named: dict[str, None] = {}
            for k in range(len(links)):
                cases.put_together(answer(k), ids, named)
            cases.check_suites(named)
            for k, (_, here, _, _) in enumerate(links):
                try:
                    here.send(True)
                except OSError:
                    answer(k)  # gone: said as a worker that died
        done: dict[int, dict[str, list[EpisodeResult]]] = {}
        waiting = set(range(len(links)))
        while waiting:
            watched = {obj: k for k in waiting for obj in links[k][1::2]}  # each worker's pipe and its end
            for k in {watched[ready] for ready in wait(list(watched))}:
                kind, value = answer(k)  # a failure is raised there
                if kind == _TICK:
                    progress()
                elif kind == _DONE:
                    done[k] = value
                    waiting.discard(k)
                else:
                    raise RuntimeError(f"a worker process sent {kind!r}, which the parent does not read")
        out: dict[str, list[EpisodeResult]] = {spec.identity: [] for spec in specs}
        for k in range(len(links)):
            for identity, results in done[k].items():
                out[identity].extend(results)
        return out
    except BaseException:  # interrupted, refused, or a worker gone: the others are stopped, not waited for
        for process, _, _, _ in links:
            if process.is_alive():
                process.kill()
        raise
    finally:
        try:
            if stop is not None:  # the watchers gone before the pipes they may shut are closed (and their numbers reused)
                os.write(stop[1], b"x")
                for watcher in watchers:
                    if watcher.ident is not None:  # started
                        watcher.join()
                os.close(stop[0])
                os.close(stop[1])
        finally:
            for process, here, _, ended in links:
                here.close()
                if isinstance(ended, int) and ended != process.sentinel:
                    os.close(ended)
                if process.pid is not None:  # started
                    process.join()
                    process.close()  # its sentinel's descriptor, now, not when the object is collected
            del _JOBS[job]
