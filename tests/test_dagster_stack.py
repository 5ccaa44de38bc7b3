"""`gate ui` as a data engineer runs it: the real webserver, daemon, queued run coordinator and
code server, driven through GraphQL as the UI's buttons drive it.

One stack serves the module (starting it costs ~15 s); the last test stops it with SIGTERM and
checks that nothing it started is left and the port is free.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate_pipeline.dagster_defs.instance import MARKER
from gate_pipeline.dagster_defs.webserver import (
    free_port,
    graphql,
    launch_backfill,
    launch_run,
    port_in_use,
    wait_for_backfill,
    wait_for_run,
)
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.settings import Settings
from gate_pipeline.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
ALL_CASES = [c.case_id for f in sorted((ROOT / "cases").rglob("*.jsonl")) for c in read_cases(f)]
GATE = [sys.executable, "-m", "gate_pipeline.cli.main"]


def started_by(gate_home: Path) -> list[int]:
    """Every live process whose environment names this GATE_HOME: all that the stack started."""
    needle = f"GATE_HOME={gate_home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_until(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)


class Stack:
    def __init__(self, tmp: Path):
        self.gate_home = tmp / "gate"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "gate-ui.log"
        self.env = {**os.environ, "GATE_HOME": str(self.gate_home), "GATE_CASES_DIR": str(ROOT / "cases")}
        self.env.pop("DAGSTER_HOME", None)
        self.env.pop("GATE_DB_URL", None)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*GATE, "ui", "--port", str(self.port)], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.served_at = wait_until(self._url_printed, 180, "gate ui printed its URL")

    def _url_printed(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"gate ui exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        return time.monotonic() if f"gate ui: {self.base}" in self.log.read_text() else None

    def store(self) -> RunStore:
        return RunStore(Settings(home=self.gate_home))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=90)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"))
    yield s
    s.stop()
    for pid in started_by(s.gate_home):  # only if a test failed before the last one stopped it
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def hanging_server():
    from scripted_server import ScriptedServer
    with ScriptedServer(hang_seconds=600) as s:
        yield s


PARTITIONS = """{ assetNodeOrError(assetKey: {path: ["staging_batches"]}) {
  ... on AssetNode { partitionKeysByDimension { partitionKeys } } } }"""


def test_every_case_partition_is_there_when_the_url_is_printed(stack):
    keys = graphql(stack.base, PARTITIONS)["assetNodeOrError"]["partitionKeysByDimension"][0]["partitionKeys"]
    assert keys == ALL_CASES
    config = (stack.gate_home / "dagster" / "dagster.yaml").read_text()
    assert config.startswith(MARKER) and "run_monitoring:\n  enabled: true" in config
    assert "telemetry:\n  enabled: false" in config


def test_a_busy_port_is_one_line_and_a_non_zero_exit(stack):
    out = subprocess.run([*GATE, "ui", "--port", str(stack.port)], env=stack.env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"gate: error: port {stack.port} on 127.0.0.1 is already in use: stop what listens there, "
        f"or pass --port with a free one"]


CHECKS = """{ assetCheckExecutions(assetKey: {path: ["staging_batches"]}, checkName: "contract", limit: 50) {
  runId status partition evaluation { partition success } } }"""


def test_a_backfill_over_four_cases_succeeds_and_checks_carry_their_partition(stack):
    cases = ["eval-clean-control-0", "eval-orphan-customer-0", "eval-amount-bounds-1", "eval-resent-rows-0"]
    assets = ["staging_batches", "agent_report", "wh_customers", "wh_orders", "revenue_mart"]
    backfill = launch_backfill(stack.base, assets, cases)
    out = wait_for_backfill(stack.base, backfill, timeout=600)
    assert out["status"] == "COMPLETED_SUCCESS", out
    assert len(out["runs"]) == 4 and {r["status"] for r in out["runs"]} == {"SUCCESS"}
    executions = graphql(stack.base, CHECKS)["assetCheckExecutions"]
    assert sorted(e["partition"] for e in executions) == sorted(cases)
    assert all(e["evaluation"]["partition"] == e["partition"] for e in executions)
    passed = {e["partition"]: e["evaluation"]["success"] for e in executions}
    assert passed == {"eval-clean-control-0": True, "eval-orphan-customer-0": False,
                      "eval-amount-bounds-1": False, "eval-resent-rows-0": False}
    def graded():
        grades = [g for c in cases for g in stack.store().latest_grades(c).values()]
        return grades if len(grades) >= len(cases) else None
    grades = wait_until(graded, 90, "the grading sensor graded the backfill's episodes")
    assert sorted(g["case_id"] for g in grades) == sorted(cases)
    assert all(g["agent"] == "careful" for g in grades)


def test_a_killed_run_worker_is_failed_by_monitoring_and_its_episode_graded_zero(stack, hanging_server):
    case_id = "eval-clean-control-1"
    options = {"model": "hang", "base_url": hanging_server.url, "retries": 0, "timeout": 300}
    run_id = launch_run(stack.base, "play_case",
                        {"ops": {"agent_episode": {"config": {"agent": "model", "agent_options": options}}}},
                        tags={"dagster/partition": case_id, "dagster/max_runtime": "5"})
    store = stack.store()
    [episode] = wait_until(lambda: store.episodes(run_id=run_id), 120, "the episode started")
    assert episode["status"] == "running"
    # the run worker: a child the code server spawned (multiprocessing) for the one run in flight
    workers = [p for p in started_by(stack.gate_home) if "multiprocessing.spawn" in cmdline(p)]
    assert len(workers) == 1
    for pid in workers:
        os.kill(pid, signal.SIGKILL)  # the worker dies with its episode open, as in an OOM kill or a reboot
    assert wait_for_run(stack.base, run_id, timeout=120) == "FAILURE"
    grade = wait_until(lambda: stack.store().latest_grades(case_id).get("hang"), 120,
                       "the orphaned episode was graded")
    assert grade["reward"] == 0.0 and grade["failed"] is True
    assert "Dagster run" in grade["reason"]
    assert stack.store().episode(episode["episode_id"])["status"] == "ended"
    # nothing is blocked: the next run of the same case plays and succeeds
    again = launch_run(stack.base, "play_case", tags={"dagster/partition": case_id})
    assert wait_for_run(stack.base, again, timeout=180) == "SUCCESS"


def test_sigterm_ends_every_process_and_frees_the_port(stack):
    assert len(started_by(stack.gate_home)) >= 4  # gate ui, dagster dev, webserver, daemon (+ code servers)
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=90) == 128 + signal.SIGTERM
    assert started_by(stack.gate_home) == []
    assert not port_in_use(stack.port)
