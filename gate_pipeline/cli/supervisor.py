"""Keep long-running processes up: `gate ui`'s Dagster code server, webserver and daemon.

Each `Service` runs in a process group of its own (what it spawns, a code server's run workers
included, goes with it), its output read line by line, its last lines kept, and passed on to `out`
(Dagster's log records at the level asked for and above; while `stop` runs, only the first line
of each record: a run the stop interrupts logs its stack trace to its event log, not here).
`Supervisor.check()` looks at every service: one that exited without being asked to is started
again, with one line on `out` saying which, why and how many restarts the hour has left, at most
`restarts` times in any hour; one more exit and `check()` raises `GaveUp`, whose message names the
service, how it ended (exit status or signal) and the last error it printed. A restart waits
`delay` (1 s); one of a service that lived less than a minute waits `delay` × 2ⁿ, n its restarts in
the hour, so a service that cannot start uses its restarts in seconds, not in a tight loop.

Nothing here knows Dagster: the command line decides what runs (cli/ui.py).
"""
from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..dagster_defs.webserver import stop_process_group

WINDOW_S = 3600.0
TAIL_LINES = 40
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# the start of one of Dagster's log records: "2026-01-01 02:00:00 +0000 - dagster.daemon - INFO - ..."
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - \S+ - (DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
ERROR_LINE = re.compile(r"error|exception|errno|fatal|refused|denied|cannot|could not|failed", re.IGNORECASE)


class GaveUp(Exception):
    """A service stopped more often than the supervisor restarts it; the message says which and why."""


def how_it_ended(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass
class Service:
    name: str                 # as a sentence names it: "the Dagster daemon"
    cmd: list[str]
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: deque = field(default_factory=deque)   # when each restart happened (monotonic seconds)
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    readers: list = field(default_factory=list)
    showing: bool = True  # whether the log record being read is at the level shown

    def last_error(self) -> str:
        """The last error it printed since it was started (a log record at ERROR or CRITICAL, or a line
        outside Dagster's records that reads as one: a traceback's last line, uvicorn's complaint), or ""."""
        errors = []
        for raw in self.tail:
            line = ANSI.sub("", raw).strip()
            record = RECORD.match(line)
            if record is not None:
                if LEVELS[record.group(1).lower()] >= LEVELS["error"]:
                    errors.append(line[record.end():])
            elif ERROR_LINE.search(line) and not line.startswith(("Traceback", "File ")):
                errors.append(line)
        return errors[-1][:400] if errors else ""


class Supervisor:
    def __init__(self, services: list[Service], restarts: int = 5, out=None, level: str = "info",
                 window: float = WINDOW_S, delay: float = 1.0):
        self.services = services
        self.restarts = restarts
        self.window = window
        self.delay = delay  # before the first restart; doubled for each restart within a minute of the last
        self.out = out
        self.level = LEVELS[level]
        self.lock = threading.Lock()
        self.stopping = False
        self._due: dict[str, float] = {}  # a service that stopped: when it is started again

    def say(self, text: str) -> None:
        if self.out is None:
            return
        with self.lock:
            try:
                if not self.out.isatty():  # Dagster colours its log lines: not in a file
                    text = ANSI.sub("", text)
                self.out.write(text + "\n")
                self.out.flush()
            except (OSError, ValueError):  # a closed terminal or pipe: the service goes on regardless
                pass

    def start(self, service: Service) -> None:
        service.proc = subprocess.Popen(service.cmd, env=service.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        service.started_at = time.monotonic()
        service.tail.clear()
        service.showing = True
        reader = threading.Thread(target=self._read, args=(service, service.proc), daemon=True,
                                  name=f"output of {service.name}")
        reader.start()
        service.readers = [r for r in service.readers if r.is_alive()] + [reader]

    def _read(self, service: Service, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            service.tail.append(line)
            if self.shown(service, line):
                self.say(line)
        proc.stdout.close()

    def shown(self, service: Service, line: str) -> bool:
        """Whether a line of output is passed on: each Dagster log record (with the lines that follow it) at or
        above the level; anything else (a Python traceback, print output) always. A run worker's console logs
        every Dagster event at DEBUG; its run's event log keeps them all either way."""
        record = RECORD.match(ANSI.sub("", line))
        if record is not None:
            service.showing = LEVELS[record.group(1).lower()] >= self.level
            return service.showing
        if self.stopping:  # while everything stops: the first line of each record, no stack traces of the
            return False   # interrupted (a run's event log keeps them)
        return service.showing

    def alive(self, service: Service) -> bool:
        return service.proc is not None and service.proc.poll() is None

    def check(self) -> None:
        """Restart what stopped on its own (within the hour's budget); GaveUp once a service is out of it."""
        if self.stopping:
            return
        now = time.monotonic()
        for service in self.services:
            if service.proc is None or self.alive(service):
                continue
            if service.name in self._due:
                if now >= self._due[service.name]:
                    del self._due[service.name]
                    service.restarts.append(now)
                    self.start(service)
                continue
            for reader in service.readers:  # its last words are read before anyone quotes them
                reader.join(timeout=2.0)
            while service.restarts and now - service.restarts[0] > self.window:
                service.restarts.popleft()
            ended = how_it_ended(service.proc.returncode)
            lived = now - service.started_at
            said = service.last_error()
            cause = f"{ended} after {lived:.0f} s" + (f"; its last error: {said}" if said else "")
            if len(service.restarts) >= self.restarts:
                n = len(service.restarts)
                budget = (f"and it was already restarted {n} time{'' if n == 1 else 's'} within the hour (at most "
                          f"{self.restarts})" if self.restarts else "and restarts are off (--restarts 0)")
                raise GaveUp(f"{service.name} stopped ({cause}), {budget}: gate ui gives up and stops Dagster")
            delay = self.delay * (2 ** len(service.restarts) if lived < 60 else 1)
            self._due[service.name] = now + delay
            self.say(f"gate ui: {service.name} stopped ({cause}); starting it again in {delay:.3g} s "
                     f"(restart {len(service.restarts) + 1} of at most {self.restarts} an hour)")

    def stop(self, services: list[Service], first=signal.SIGTERM, grace: float = 30.0) -> bool:
        """Stop these services (their whole process groups) at once; True when nothing of them is left."""
        self.stopping = True
        running = [s for s in services if s.proc is not None]
        results: dict[str, bool] = {}

        def stop_one(service: Service) -> None:
            assert service.proc is not None
            results[service.name] = stop_process_group(service.proc, first=first, grace=grace)

        threads = [threading.Thread(target=stop_one, args=(s,)) for s in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for service in running:
            for reader in service.readers:
                reader.join(timeout=2.0)
        return all(results.values())
