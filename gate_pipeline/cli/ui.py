"""`gate ui`: the Dagster UI and daemon on 127.0.0.1 over gate's code location, supervised.

Before Dagster starts: the port must be free (else one line, exit 2), the instance directory
gets gate's dagster.yaml (run monitoring on, a maximum runtime for every run, telemetry off:
dagster_defs/instance.py) and the case partitions are registered, so the first page already lists
every case. Then `gate ui` runs the three processes `dagster dev` would, each in a process group
of its own, and keeps them up (cli/supervisor.py): the code server (`dagster code-server start`,
which loads gate's definitions and spawns the run workers), the webserver and the daemon, both
reading the code location from that code server. One that dies is started again (one line each
time, at most `--restarts` times an hour); past that, `gate ui` says which one and why, stops the
rest and exits 1. Their logs, at INFO, come out on `gate ui`'s stderr.

SIGINT (Ctrl-C), SIGTERM and SIGHUP stop the webserver and the daemon, then the code server and
its run workers (SIGTERM to each group; SIGKILL for what is left after a grace period), without a
traceback; `gate ui` returns only when none of them is left. The URL is printed once the server
answers.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..kernel.settings import Settings
from .common import int_arg
from .errors import UsageError

START_TIMEOUT_S = 300
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RESTARTS_PER_HOUR = 5
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def dagster_home(settings: Settings) -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or settings.home / "dagster").resolve()


def _exe(tool: str) -> str:
    exe = shutil.which(tool, path=str(Path(sys.executable).parent)) or shutil.which(tool)
    if exe is None:
        raise UsageError(f"{tool} is not installed in this environment")
    return exe


def services(a, workspace: Path, code_port: int, env: dict):
    """The code server, the webserver and (unless --no-daemon) the daemon, as `dagster dev` runs them."""
    from ..dagster_defs.instance import ATTRIBUTE, LOCATION, MODULE
    from .supervisor import Service

    code = Service("the Dagster code server", [
        _exe("dagster"), "code-server", "start", "-h", "127.0.0.1", "-p", str(code_port), "-m", MODULE,
        "-a", ATTRIBUTE, "--location-name", LOCATION, "--log-level", a.log_level], env)
    web = Service("the Dagster webserver", [
        _exe("dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", str(a.port),
        "--dagster-log-level", a.log_level, "--uvicorn-log-level", "warning"], env)
    out = [code, web]
    if not a.no_daemon:
        out.append(Service("the Dagster daemon", [
            _exe("dagster-daemon"), "run", "-w", str(workspace), "--log-level", a.log_level], env))
    return out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _serving(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/server_info", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _wait(ready, supervisor, received: list, what: str, deadline: float) -> bool:
    """Until `ready()` (True) or a stop signal (False), restarting what dies meanwhile; TimeoutError at `deadline`."""
    while not received:
        supervisor.check()
        if ready():
            return True
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {START_TIMEOUT_S} s")
        time.sleep(0.3)
    return False


def cmd_ui(a, settings: Settings) -> int:
    from ..dagster_defs.instance import MAX_RUNTIME_S, prepare_instance_dir, write_workspace
    from ..dagster_defs.webserver import free_port, port_in_use
    from .supervisor import GaveUp, Supervisor

    if port_in_use(a.port):
        raise UsageError(f"port {a.port} on 127.0.0.1 is already in use: stop what listens there, "
                         f"or pass --port with a free one")
    from ..store import RunStore
    RunStore(settings).dispose()  # a bad GATE_DB_URL or an unreachable database server is one line, before Dagster
    home = dagster_home(settings)
    code_port = free_port()
    try:
        warnings = prepare_instance_dir(home, settings.db_url,
                                        MAX_RUNTIME_S if a.max_runtime is None else a.max_runtime)
        workspace = write_workspace(home, code_port)
    except OSError as exc:
        raise UsageError(f"cannot prepare the Dagster instance directory {home}: {exc}") from None
    for warning in warnings:
        print(f"gate: warning: {warning}", file=sys.stderr)
    env = {**os.environ, "DAGSTER_HOME": str(home), "GATE_HOME": str(settings.home)}  # absolute for every process
    parts = services(a, workspace, code_port, env)

    import dagster as dg

    from ..dagster_defs.partitions import sync_case_partitions
    with dg.DagsterInstance.from_config(str(home)) as instance:
        added, _, problems = sync_case_partitions(instance, settings.cases_dir)
    for problem in problems:
        print(f"gate: warning: {problem}", file=sys.stderr)
    print(f"gate: DAGSTER_HOME={home}; {len(added)} case partitions added; starting Dagster", file=sys.stderr,
          flush=True)

    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    supervisor = Supervisor(parts, restarts=a.restarts, out=sys.stderr, level=a.log_level)
    code, web, rest = parts[0], parts[1], parts[2:]
    base = f"http://127.0.0.1:{a.port}"
    status = 0
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        supervisor.start(code)  # the webserver and the daemon load the code location from it: it comes first
        if _wait(lambda: _listening(code_port), supervisor, received, "the Dagster code server did not start",
                 deadline):
            for service in (web, *rest):
                supervisor.start(service)
            if _wait(lambda: _serving(base), supervisor, received,
                     f"the Dagster webserver did not answer on {base}", deadline):
                print(f"gate ui: {base}", flush=True)
        while not received:
            supervisor.check()
            time.sleep(0.5)
    except GaveUp as exc:
        print(f"gate: error: {exc}", file=sys.stderr, flush=True)
        status = 1
    except TimeoutError as exc:
        print(f"gate: error: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        # what reads the code location first, then the code server and its run workers; a second Ctrl-C
        # while this runs is taken as the first (the stop is already under way)
        if received:
            print(f"gate ui: {signal.Signals(received[0]).name}: stopping Dagster", file=sys.stderr, flush=True)
        stopped = supervisor.stop([web, *rest]) & supervisor.stop([code])
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not stopped:
        print("gate: warning: some of Dagster's processes did not end", file=sys.stderr)
    if received and not status:
        return 128 + received[0]
    return status


def register(subparsers) -> None:
    u = subparsers.add_parser("ui", help="start the Dagster UI and daemon on 127.0.0.1",
                              description="The Dagster webserver, daemon and code server over gate's code location, "
                                          "on the instance in DAGSTER_HOME (default: GATE_HOME/dagster), each one "
                                          "restarted when it dies; Ctrl-C or SIGTERM stops all of it.",
                              epilog="examples:\n  gate ui\n  gate ui --port 3001 --no-daemon\n"
                                     "  gate ui --max-runtime 7200   # asset-page runs of a slow model")
    u.add_argument("--port", type=int_arg("--port", 1, 65535), default=3000, help="port on 127.0.0.1 (default 3000)")
    u.add_argument("--no-daemon", action="store_true", help="no daemon: the webserver and the code server only (no "
                   "sensors, schedules or queued runs)")
    u.add_argument("--max-runtime", type=int_arg("--max-runtime", 0, 10**7), default=None, metavar="SECONDS",
                   help="how long a run without a dagster/max_runtime tag of its own (the asset page's and "
                        "backfills' runs) may go before run monitoring fails it; 0: no limit (default 1800)")
    u.add_argument("--restarts", type=int_arg("--restarts", 0, 1000), default=RESTARTS_PER_HOUR, metavar="N",
                   help=f"restarts of the code server, webserver or daemon allowed per hour each before gate ui "
                        f"gives up (default {RESTARTS_PER_HOUR}; 0: never restart)")
    u.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="the lowest level of Dagster's and gate's log lines shown (default info; a run's event log "
                        "in the UI keeps every level)")
    u.set_defaults(fn=cmd_ui)
