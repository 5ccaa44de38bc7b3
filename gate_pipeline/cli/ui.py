"""`gate ui`: the Dagster UI and daemon on 127.0.0.1 over gate's code location, supervised.

Before Dagster starts: the port must be free (else one line, exit 2), the instance directory
gets gate's dagster.yaml (run monitoring on, telemetry off: dagster_defs/instance.py) and the
case partitions are registered, so the first page already lists every case. Dagster runs in a
process group of its own; SIGINT, SIGTERM and SIGHUP to `gate ui` reach that whole group (the
webserver, the daemon, code servers, run workers), and `gate ui` returns only when none of them
is left. The URL is printed once the server answers.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ..kernel.settings import Settings
from .common import int_arg
from .errors import UsageError

START_TIMEOUT_S = 300
DEV_NOTICE = "ignore:Function `dev_command` is superseded"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def dagster_home(settings: Settings) -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or settings.home / "dagster").resolve()


def _command(a, workspace: Path) -> list[str]:
    tool = "dagster-webserver" if a.no_daemon else "dagster"
    exe = shutil.which(tool, path=str(Path(sys.executable).parent)) or shutil.which(tool)
    if exe is None:
        raise UsageError(f"{tool} is not installed in this environment")
    args = ["-w", str(workspace), "-h", "127.0.0.1", "-p", str(a.port)]
    return [exe, *args] if a.no_daemon else [exe, "dev", *args]


def cmd_ui(a, settings: Settings) -> int:
    from ..dagster_defs.instance import prepare_instance_dir, write_workspace
    from ..dagster_defs.webserver import (
        port_in_use,
        stop_process_group,
        wait_until_serving,
    )

    if port_in_use(a.port):
        raise UsageError(f"port {a.port} on 127.0.0.1 is already in use: stop what listens there, "
                         f"or pass --port with a free one")
    from ..store import RunStore
    RunStore(settings).dispose()  # a bad GATE_DB_URL or an unreachable database server is one line, before Dagster
    home = dagster_home(settings)
    try:
        warnings = prepare_instance_dir(home, settings.db_url)
        workspace = write_workspace(home)
    except OSError as exc:
        raise UsageError(f"cannot prepare the Dagster instance directory {home}: {exc}") from None
    for warning in warnings:
        print(f"gate: warning: {warning}", file=sys.stderr)
    cmd = _command(a, workspace)
    env = {**os.environ, "DAGSTER_HOME": str(home), "GATE_HOME": str(settings.home),  # absolute for every process
           # `dagster dev` is what serves a code location from an installed package (`dg dev` needs a project
           # directory); its notice that `dg dev` supersedes it is noise here
           "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), DEV_NOTICE]))}

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
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{a.port}"
            try:
                if wait_until_serving(base, proc, START_TIMEOUT_S, stop=lambda: bool(received)):
                    print(f"gate ui: {base}", flush=True)
            except TimeoutError as exc:
                print(f"gate: error: {exc}", file=sys.stderr)
                return 1  # the finally clauses stop what was started
            while not received and proc.poll() is None:
                try:
                    proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            stopped = stop_process_group(proc, first=signal.SIGINT)
        if not stopped:
            print(f"gate: warning: some processes of group {proc.pid} did not end", file=sys.stderr)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        return 128 + received[0]
    print(f"gate: error: Dagster stopped on its own (exit status {proc.returncode}); its log is above",
          file=sys.stderr)
    return 1


def register(subparsers) -> None:
    u = subparsers.add_parser("ui", help="start the Dagster UI and daemon on 127.0.0.1",
                              description="dagster dev over gate's code location, on the instance in DAGSTER_HOME "
                                          "(default: GATE_HOME/dagster); Ctrl-C or SIGTERM stops all of it.",
                              epilog="examples:\n  gate ui\n  gate ui --port 3001 --no-daemon")
    u.add_argument("--port", type=int_arg("--port", 1, 65535), default=3000, help="port on 127.0.0.1 (default 3000)")
    u.add_argument("--no-daemon", action="store_true", help="webserver only (no sensors, schedules or queued runs)")
    u.set_defaults(fn=cmd_ui)
