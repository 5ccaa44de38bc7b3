"""`gate ui` as a data engineer runs it: the real webserver, daemon, queued run coordinator and
code server, driven through GraphQL as the UI's buttons drive it, and its processes killed.

One stack serves most of the module (starting it costs ~15 s); its last test stops it with Ctrl-C's
SIGINT while a nightly runs and checks that nothing it started is left, the port is free and the
log has no stack trace. A second stack (`--max-runtime 20 --restarts 2`) then loses its daemon, its
webserver, and its code server with a run worker under an asset-page run, and last gives up on a
webserver that cannot start again.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from gate_pipeline.dagster_defs.instance import MARKER
from gate_pipeline.dagster_defs.webserver import (
    free_port,
    graphql,
    launch_assets,
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
    def __init__(self, tmp: Path, *args: str):
        self.gate_home = tmp / "gate"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "gate-ui.log"
        self.env = {**os.environ, "GATE_HOME": str(self.gate_home), "GATE_CASES_DIR": str(ROOT / "cases")}
        self.env.pop("DAGSTER_HOME", None)
        self.env.pop("GATE_DB_URL", None)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*GATE, "ui", "--port", str(self.port), *args], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)
        try:
            self.served_at = wait_until(self._url_printed, 180, "gate ui printed its URL")
        except BaseException:  # a failed or interrupted start leaves nothing behind
            self.stop()
            raise

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def service(self, needle: str) -> list[int]:
        """The live processes of this stack whose command line has `needle`."""
        return [p for p in started_by(self.gate_home) if needle in cmdline(p)]

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


@contextmanager
def running(tmp: Path, *args: str):
    s = Stack(tmp, *args)
    try:
        yield s
    finally:
        s.stop()
        for pid in started_by(s.gate_home):  # only if a test failed before the last one stopped it
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running(tmp_path_factory.mktemp("stack")) as s:
        yield s


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


TICK_LINE = re.compile(r"grading_sensor - (\d+) episodes graded this tick; (\d+) grades recorded as observations: (.*)$")


def test_a_nightly_prints_info_not_every_event_and_grades(stack):
    before = len(stack.text().splitlines())
    run_id = launch_run(stack.base, "nightly_benchmark")
    assert wait_for_run(stack.base, run_id, timeout=300) == "SUCCESS"
    episodes = stack.store().episodes(run_id=run_id)
    assert len(episodes) == 96
    wait_until(lambda: all(stack.store().recorded_grade(e["episode_id"]) for e in episodes), 120,
               "the grading sensor graded the nightly's 96 episodes")
    time.sleep(2)  # the tick's last lines reach the log
    lines = stack.text().splitlines()[before:]
    assert not [line for line in lines if " - DEBUG - " in line]  # not one line per Dagster event, as a run's
    # console logger writes them (its event log keeps them): one per grade and one per grading tick
    ticks = [m for m in map(TICK_LINE.search, lines) if m]
    assert sum(int(m.group(2)) for m in ticks) >= 96  # (with, perhaps, the previous test's last grade)
    assert len([line for line in lines if "grading_sensor - graded " in line]) >= 96
    if len(ticks) == 1 and int(ticks[0].group(2)) == 96:  # a tick that graded the whole night, and only it,
        # says it as a night (a tick that also took the previous test's last grade counts that one too)
        for agent, mean in (("naive", "0.5344"), ("careful", "1.0000"), ("refuse-all", "0.3875")):
            assert f"{agent} 32 (mean {mean})" in ticks[0].group(3)


TICKS = """query($s: InstigationSelector!) { instigationStateOrError(instigationSelector: $s) {
  ... on InstigationState { ticks(limit: 100) { status skipReason cursor } } } }"""


def test_grading_ticks_say_what_they_graded(stack):
    selector = {"repositoryLocationName": "gate", "repositoryName": "__repository__", "name": "grading_sensor"}
    ticks = [t for t in graphql(stack.base, TICKS, {"s": selector})["instigationStateOrError"]["ticks"]
             if t["status"] != "STARTED"]  # (one may be under way)
    graded = [t for t in ticks if (t["skipReason"] or "").startswith("recorded ")]
    idle = [t for t in ticks if t["skipReason"] == "no new grades"]
    assert graded and idle and len(graded) + len(idle) == len(ticks)  # never "Sensor function returned an empty..."
    for t in graded:  # "recorded 2 grades: careful on eval-... 1.0000, ..." and the cursor "7 · careful on ..."
        count, summary = re.fullmatch(r"recorded (\d+) grades: (.+)", t["skipReason"]).groups()
        seq, said = re.fullmatch(r"(\d+) · (.+)", t["cursor"]).groups()
        assert said == summary and int(seq) >= int(count)
        assert re.search(r"(careful|naive|refuse-all|hang)( on eval-\S+| \d+ \(mean) \d\.\d{4}", summary), summary
    assert all(t["cursor"].isdigit() for t in idle)  # an idle tick's cursor does not repeat an older summary


def test_ctrl_c_under_a_running_nightly_ends_every_process_without_a_traceback(stack):
    assert len(started_by(stack.gate_home)) >= 5  # gate ui, code server (and its gRPC server), webserver, daemon
    run_id = launch_run(stack.base, "nightly_benchmark")
    wait_until(lambda: stack.store().episodes(run_id=run_id), 120, "the nightly started playing")
    stack.proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
    assert stack.proc.wait(timeout=120) == 128 + signal.SIGINT
    assert started_by(stack.gate_home) == []
    assert not port_in_use(stack.port)
    _, stopping = stack.text().split("gate ui: SIGINT: stopping Dagster\n")
    assert "Traceback" not in stopping and "Stack Trace" not in stopping and "KeyboardInterrupt" not in stopping
    assert "Shutting down Dagster code proxy server" in stopping  # Dagster's own lines still say what stops


# --- a second stack, whose processes die ---

CASE_ASSETS = ["staging_batches", "wh_customers", "wh_orders", "revenue_mart", "agent_report"]
MAX_RUNTIME_S, POLL_S = 20, 15  # the crash stack's --max-runtime; run monitoring's poll (instance.py)


@pytest.fixture(scope="module")
def crash_stack(tmp_path_factory):
    with running(tmp_path_factory.mktemp("crash"), "--max-runtime", str(MAX_RUNTIME_S), "--restarts", "2") as s:
        yield s


def restarted(stack: Stack, name: str) -> list[str]:
    return [line for line in stack.text().splitlines() if line.startswith(f"gate ui: the Dagster {name} stopped")]


def test_a_killed_daemon_is_restarted_and_the_next_grading_tick_grades(crash_stack):
    [daemon] = crash_stack.service("dagster-daemon run")
    os.killpg(daemon, signal.SIGKILL)
    [line] = wait_until(lambda: restarted(crash_stack, "daemon"), 60, "gate ui said it restarts the daemon")
    assert "(killed by SIGKILL after " in line and "(restart 1 of at most 2 an hour)" in line
    wait_until(lambda: [p for p in crash_stack.service("dagster-daemon run") if p != daemon], 60, "a new daemon")
    case_id = "eval-amount-bounds-2"  # queued: only a daemon launches it
    run_id = launch_run(crash_stack.base, "play_case", tags={"dagster/partition": case_id})
    assert wait_for_run(crash_stack.base, run_id, timeout=300) == "SUCCESS"
    grade = wait_until(lambda: crash_stack.store().latest_grades(case_id).get("careful"), 90,
                       "the restarted daemon's grading sensor graded the run")
    assert grade["run_id"] == run_id and grade["reward"] == 1.0
    assert crash_stack.proc.poll() is None


def test_a_killed_webserver_is_restarted_on_the_same_url(crash_stack):
    [web] = crash_stack.service("dagster-webserver")
    os.killpg(web, signal.SIGKILL)
    wait_until(lambda: restarted(crash_stack, "webserver"), 60, "gate ui said it restarts the webserver")
    keys = wait_until(lambda: _partitions(crash_stack.base), 120, "the webserver answers again")
    assert keys == ALL_CASES


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _partitions(base: str):
    try:
        return graphql(base, PARTITIONS, timeout=5)["assetNodeOrError"]["partitionKeysByDimension"][0]["partitionKeys"]
    except OSError:
        return None


def test_an_asset_page_run_whose_worker_and_code_server_die_fails_within_its_max_runtime(crash_stack,
                                                                                        hanging_server):
    case_id = "eval-clean-control-1"
    options = {"model": "hang", "base_url": hanging_server.url, "retries": 0, "timeout": 300}
    # the asset page's Materialize with its launchpad's config: no dagster/max_runtime tag of its own
    run_id = launch_assets(crash_stack.base, CASE_ASSETS, case_id,
                           {"ops": {"agent_episode": {"config": {"agent": "model", "agent_options": options}}}})
    store = crash_stack.store()
    [episode] = wait_until(lambda: store.episodes(run_id=run_id), 120, "the episode started")
    started = time.monotonic()
    [code] = crash_stack.service("code-server start")
    workers = [p for p in crash_stack.service("multiprocessing.spawn") if os.getpgid(p) == code]
    assert len(workers) == 1  # the run worker, in the code server's process group
    os.killpg(code, signal.SIGKILL)  # the code server, its gRPC server and the run worker at once: none reports
    wait_until(lambda: restarted(crash_stack, "code server"), 60, "gate ui said it restarts the code server")
    assert wait_for_run(crash_stack.base, run_id, timeout=MAX_RUNTIME_S + 3 * POLL_S + 60) == "FAILURE"
    assert time.monotonic() - started < MAX_RUNTIME_S + 2 * POLL_S + 15  # failed by monitoring once past it
    grade = wait_until(lambda: crash_stack.store().latest_grades(case_id).get("hang"), 120,
                       "the orphaned episode was graded")
    assert grade["reward"] == 0.0 and grade["failed"] is True
    assert grade["reason"].startswith("the Dagster run failed: ")
    assert f"maximum runtime of {MAX_RUNTIME_S} seconds" in grade["reason"]
    assert crash_stack.store().episode(episode["episode_id"])["status"] == "ended"


def test_gate_ui_gives_up_with_the_cause_when_a_part_cannot_start_again(crash_stack):
    [web] = crash_stack.service("dagster-webserver")
    with socket.socket() as squatter:  # someone takes the port the moment the webserver is gone
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old connections' TIME_WAIT
        os.killpg(web, signal.SIGKILL)
        wait_until(lambda: _bound(squatter, crash_stack.port), 5, "the port is taken", poll=0.02)  # before gate ui
        squatter.listen()                                                                      # restarts it (1 s)
        assert crash_stack.proc.wait(timeout=180) == 1
    log = crash_stack.text().splitlines()
    [error] = [line for line in log if line.startswith("gate: error: ")]
    assert error.startswith("gate: error: the Dagster webserver stopped (exit status ")
    assert "address already in use" in error
    assert "already restarted 2 times within the hour (at most 2): gate ui gives up and stops Dagster" in error
    assert started_by(crash_stack.gate_home) == []
