"""Real servers on 127.0.0.1 for tests and benchmarks: PostgreSQL, Redis, Celery workers.

Each one runs in a process group of its own, in a temporary directory, and is stopped with its
whole group when the `with` block ends (Ctrl-C or a failure included); nothing is left behind.

- `need(*packages)`: skip the test, in one line naming the packages, when one of the system packages
  scripts/test-setup knows (postgresql, redis-server, chromium) is not installed.
- `postgres()`: Debian's PostgreSQL (`initdb` and `postgres` from /usr/lib/postgresql/*/bin, or
  on PATH), a fresh cluster in a temporary directory, password authentication over TCP. Run as
  root, it runs as the `postgres` user (`runuser`), since PostgreSQL refuses root.
- `redis()`: Debian's `redis-server`, nothing saved to disk.
- `celery_workers()`: `dagster-celery worker start` processes (dagster-celery's own command),
  each one a Celery worker with one process running tasks, waited for until each answers a ping.
- `start_server(...)` / `stop_server(proc)`: `gate serve --port 0 ...` and its stop by a signal.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gate_pipeline.dagster_defs.webserver import free_port, stop_process_group

BIN = Path(sys.executable).parent
PG_USER, PG_PASSWORD = "gate", "gate-test-pw"


def _test_setup():
    """scripts/test-setup, the one place that says where the system packages the tests start are."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "test-setup"
    spec = importlib.util.spec_from_loader("gate_test_setup", importlib.machinery.SourceFileLoader("gate_test_setup",
                                                                                                    str(path)))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module


SETUP = _test_setup()
postgres_bin = SETUP.postgres_bin


def need(*packages: str) -> None:
    """Skip the calling test, in one line naming the Debian packages, when any of `packages` is not installed."""
    absent = SETUP.missing(packages)
    if absent:
        import pytest
        pytest.skip(SETUP.skip_reason(absent))


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


@dataclass
class Postgres:
    port: int
    proc: subprocess.Popen

    def url(self, database: str = "postgres", driver: str = "psycopg") -> str:
        return f"postgresql+{driver}://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its SQLAlchemy URL (psycopg 3)."""
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, password=PG_PASSWORD,
                             dbname="postgres", autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextmanager
def postgres(timeout: float = 60.0):
    """A PostgreSQL server on a free port of 127.0.0.1, in a temporary cluster; yields a `Postgres`."""
    initdb, server = postgres_bin("initdb"), postgres_bin("postgres")
    if initdb is None or server is None:
        raise RuntimeError(SETUP.PACKAGES["postgresql"].skip_reason())
    root = Path(tempfile.mkdtemp(prefix="gate-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL will not run as root
        pg = pwd.getpwnam("postgres")
        os.chown(root, pg.pw_uid, pg.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, sockets, pwfile = root / "data", root / "sockets", root / "pw"
    pwfile.write_text(PG_PASSWORD)
    sockets.mkdir()
    if as_user:
        for path in (pwfile, sockets):
            os.chown(path, pg.pw_uid, pg.pw_gid)
    proc = None
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-U", PG_USER, f"--pwfile={pwfile}", "-E", "UTF8",
                        "--auth-host=scram-sha-256", "--auth-local=trust", "--no-sync"],
                       check=True, capture_output=True, timeout=timeout)
        port = free_port()
        log = open(root / "server.log", "wb")
        proc = subprocess.Popen([*as_user, server, "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                                 "-k", str(sockets), "-c", "fsync=off", "-c", "synchronous_commit=off",
                                 "-c", "full_page_writes=off", "-c", "max_connections=300"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _wait_for_port(port, proc, "postgres", timeout)
        _wait_for_connections(port, proc, timeout)
        yield Postgres(port, proc)
    finally:
        if proc is not None:
            stop_process_group(proc, first=signal.SIGINT, grace=20.0)  # SIGINT: PostgreSQL's fast shutdown
        shutil.rmtree(root, ignore_errors=True)


def _wait_for_connections(port: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until the server accepts a login (it listens a moment before it has started up)."""
    import psycopg
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(host="127.0.0.1", port=port, user=PG_USER, password=PG_PASSWORD, dbname="postgres",
                            connect_timeout=5).close()
            return
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextmanager
def redis(timeout: float = 30.0):
    """A Redis server on a free port of 127.0.0.1 (nothing saved); yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError(SETUP.PACKAGES["redis-server"].skip_reason())
    root = Path(tempfile.mkdtemp(prefix="gate-redis-"))
    port = free_port()
    proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(root), "--protected-mode", "yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, proc, "redis-server", timeout)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process_group(proc, first=signal.SIGTERM, grace=10.0)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def celery_workers(broker: str, count: int, dagster_home: Path, env: dict | None = None, log_dir: Path | None = None,
                   timeout: float = 120.0):
    """`count` Celery workers (`dagster-celery worker start`, one task at a time each) on `broker`;
    yields their node names once every one answers a ping."""
    from gate_pipeline.dagster_defs.jobs import celery_config
    config = dagster_home / "celery.yaml"
    dagster_home.mkdir(parents=True, exist_ok=True)
    settings = celery_config(broker)
    config.write_text(f"execution:\n  config:\n    broker: '{settings['broker']}'\n    backend: '{settings['backend']}'\n")
    full_env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(dagster_home), "GATE_CELERY_BROKER": broker,
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    import dagster as dg
    with dg.DagsterInstance.from_config(str(dagster_home)):  # its storage made once, not by each worker at once
        pass
    exe = str(BIN / "dagster-celery")
    names = [f"gate-w{i}-{os.getpid()}" for i in range(count)]
    procs = []
    try:
        for name in names:
            out = open(log_dir / f"{name}.log", "wb") if log_dir else subprocess.DEVNULL
            procs.append(subprocess.Popen(
                [exe, "worker", "start", "-A", "dagster_celery.app", "-y", str(config), "-n", name, "-l", "WARNING",
                 "--", "--concurrency", "1", "--without-gossip", "--without-mingle"],
                env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for_workers(broker, names, procs, timeout)
        yield names
    finally:
        for proc in procs:  # SIGTERM: Celery's warm shutdown (the task in hand ends first)
            stop_process_group(proc, first=signal.SIGTERM, grace=20.0)


def _wait_for_workers(broker: str, names: list[str], procs: list, timeout: float) -> None:
    from celery import Celery
    app = Celery("gate-ping", broker=broker)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a celery worker exited with status {proc.returncode}")
            answered = {name.split("@")[0] for reply in app.control.ping(timeout=1.0) for name in reply}
            if all(n in answered for n in names):
                return
        raise TimeoutError(f"celery workers {names} did not all answer within {timeout:.0f} s")
    finally:
        app.close()


def start_server(*args: str, timeout: float = 60.0, open_files: int | None = None):
    """`gate serve --port 0 ...` in a process group of its own; (process, base URL, stderr lines). `open_files`:
    its open-files limit, soft and hard (`ulimit -n`)."""
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    proc = subprocess.Popen([sys.executable, "-m", "gate_pipeline.cli.main", "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=limit if open_files else None)
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    try:
        first = lines.get(timeout=timeout)
    except queue.Empty:
        stop_server(proc)
        raise AssertionError(f"gate serve printed nothing in {timeout} s: {''.join(err)[-2000:]}") from None
    url = first.split(" on ", 1)[1].split(" ", 1)[0]
    assert url.startswith("http://127.0.0.1:"), first
    return proc, url, err


def stop_server(proc, sig=signal.SIGTERM) -> int:
    """Signal the server's process group and wait; kill it if it does not stop."""
    try:
        os.killpg(proc.pid, sig)
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("gate serve did not stop within 20 s of the signal") from None
    except ProcessLookupError:
        return proc.wait()
