"""Start a real `dagster-webserver` on 127.0.0.1 over workspace.yaml, and ask it GraphQL.

Used by `gate ui`, the tests, the launch benchmark and the screenshot script: a free port, a
wait until the server answers, GraphQL, and a guaranteed stop of a whole process tree (the
server, the daemon, the code servers and run workers they spawned: one process group).
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


def graphql(base_url: str, query: str, variables: dict | None = None, timeout: float = 60.0) -> dict:
    body = {"query": query, **({"variables": variables} if variables else {})}
    req = urllib.request.Request(f"{base_url}/graphql", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = json.loads(resp.read())
    if out.get("errors"):
        raise RuntimeError(f"GraphQL errors: {out['errors']}")
    return out["data"]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not listen on host:port now (bound as uvicorn binds, SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def wait_until_serving(base_url: str, proc: subprocess.Popen, timeout: float, stop=lambda: False) -> bool:
    """Poll `base_url/server_info` until it answers (True); False if `proc` exits or `stop()` first.

    Raises TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not stop():
        try:
            with urllib.request.urlopen(f"{base_url}/server_info", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Dagster webserver did not answer on {base_url} within {timeout:.0f} s") from None
            time.sleep(0.3)
    return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(proc: subprocess.Popen, first=signal.SIGINT, grace: float = 30.0) -> bool:
    """End `proc` and every process in its group (it was started with start_new_session=True).

    `first` goes to the whole group, as a terminal's Ctrl-C would (Dagster shuts down cleanly on
    SIGINT: the webserver, the daemon, code servers and run workers). What is left after `grace`
    seconds gets SIGTERM, then SIGKILL. True when no process of the group is left."""
    pgid = proc.pid
    for sig, wait in ((first, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None and not group_alive(pgid):
            return True
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            if not group_alive(pgid):
                return True
            time.sleep(0.2)
    return proc.poll() is not None and not group_alive(pgid)


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
        if not wait_until_serving(base, proc, timeout):
            raise RuntimeError(f"dagster-webserver exited with status {proc.returncode}")
        yield base
    finally:
        stop_process_group(proc, first=signal.SIGTERM, grace=15.0)


# --- launching as the UI's buttons do (GraphQL mutations), and waiting for the outcome ---

LAUNCH_RUN = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message }
  ... on PipelineNotFoundError { message } ... on InvalidStepError { invalidStepKey } } }"""
REEXECUTE = """mutation($p: ReexecutionParams!) { launchPipelineReexecution(reexecutionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
RUN_STATUS = """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }"""
LAUNCH_BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  __typename ... on PartitionBackfill { status runs(limit: 1000) { runId status } } } }"""
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


def launch_run(base_url: str, job: str, run_config: dict | None = None, tags: dict | None = None,
               location: str = "gate") -> str:
    """Launch `job` as the Launchpad does (queued: the daemon dequeues it); return the run id."""
    params = {"selector": {"repositoryLocationName": location, "repositoryName": "__repository__", "jobName": job},
              "runConfigData": run_config or {},
              "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}}
    out = graphql(base_url, LAUNCH_RUN, {"p": params})["launchRun"]
    if out["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launchRun: {out}")
    return out["run"]["runId"]


def launch_assets(base_url: str, assets: list[str], partition: str, run_config: dict | None = None,
                  tags: dict | None = None, location: str = "gate") -> str:
    """The asset page's Materialize (with its launchpad's config, if any) for one partition: a run of
    the implicit `__ASSET_JOB` over `assets`, queued; return the run id."""
    selector = {"repositoryLocationName": location, "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
                "assetSelection": [{"path": [a]} for a in assets], "assetCheckSelection": []}
    params = {"selector": selector, "runConfigData": run_config or {},
              "executionMetadata": {"tags": [{"key": k, "value": v}
                                             for k, v in {"dagster/partition": partition, **(tags or {})}.items()]}}
    out = graphql(base_url, LAUNCH_RUN, {"p": params})["launchRun"]
    if out["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launchRun: {out}")
    return out["run"]["runId"]


def reexecute_from_failure(base_url: str, parent_run_id: str) -> str:
    """The Runs page's "Re-execute from failure"; return the new run id."""
    out = graphql(base_url, REEXECUTE, {"p": {"parentRunId": parent_run_id, "strategy": "FROM_FAILURE"}})
    out = out["launchPipelineReexecution"]
    if out["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launchPipelineReexecution: {out}")
    return out["run"]["runId"]


def run_status(base_url: str, run_id: str) -> str:
    return graphql(base_url, RUN_STATUS, {"id": run_id})["runOrError"].get("status", "")


def wait_for_run(base_url: str, run_id: str, timeout: float = 300.0, poll: float = 0.25) -> str:
    """Poll until the run is finished; return its status (SUCCESS, FAILURE, CANCELED)."""
    deadline = time.monotonic() + timeout
    while (status := run_status(base_url, run_id)) not in FINISHED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {status} after {timeout:.0f} s")
        time.sleep(poll)
    return status


def launch_backfill(base_url: str, assets: list[str], partitions: list[str], tags: dict | None = None) -> str:
    """The asset page's "Materialize" over several partitions: an asset backfill; return its id."""
    params = {"partitionNames": partitions, "assetSelection": [{"path": [a]} for a in assets],
              "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}
    out = graphql(base_url, LAUNCH_BACKFILL, {"p": params})["launchPartitionBackfill"]
    if out["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"launchPartitionBackfill: {out}")
    return out["backfillId"]


def wait_for_backfill(base_url: str, backfill_id: str, timeout: float = 600.0) -> dict:
    """Poll until the backfill is no longer in progress; return {status, runs}."""
    deadline = time.monotonic() + timeout
    while True:
        out = graphql(base_url, BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        if out.get("status") not in (None, "REQUESTED", "CANCELING"):
            return out
        if time.monotonic() > deadline:
            raise TimeoutError(f"backfill {backfill_id} still {out.get('status')} after {timeout:.0f} s")
        time.sleep(0.5)
