"""Start a real `dagster-webserver` on 127.0.0.1 over workspace.yaml, and ask it GraphQL.

Used by the webserver test and the screenshot script: a free port, a wait until the server
answers, and a guaranteed stop (the server and the code server it spawned, by the process
group of the process started here).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(base_url: str, query: str, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(f"{base_url}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = json.loads(resp.read())
    if body.get("errors"):
        raise RuntimeError(f"GraphQL errors: {body['errors']}")
    return body["data"]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass


@contextmanager
def webserver(root: Path, dagster_home: Path, env: dict | None = None, timeout: float = 90.0, log=None):
    """Yield the base URL of a dagster-webserver serving `root/workspace.yaml`; always stopped."""
    exe = shutil.which("dagster-webserver", path=str(Path(sys.executable).parent)) or "dagster-webserver"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    full_env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(dagster_home)}
    proc = subprocess.Popen([exe, "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)], cwd=root,
                            env=full_env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dagster-webserver exited with status {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/server_info", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"dagster-webserver did not answer on {base} within {timeout:.0f} s")
                time.sleep(0.3)
        yield base
    finally:
        _stop(proc)
