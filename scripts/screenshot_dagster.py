"""Screenshot gate in the real Dagster UI with Debian's headless chromium: the pictures of docs/dagster.md.

A real `gate ui` (code server, webserver, daemon) in a temporary GATE_HOME, driven through GraphQL
as the UI's buttons drive it: three cases played with naive and then careful (`play_case`), the
nightly benchmark twice (a history of two nights), then a wait until the grading sensor's ticks
have graded every episode. Then headless chromium, driven over its DevTools protocol, photographs
five pages (SHOTS): the lineage, `agent_report`'s partition last materialized by careful (the
nightlies' agents observed it later), the contract check, the scoreboard with its history, and
the grading sensor's ticks with the logs of a tick that graded a night opened.
Writes docs/dagster-*.png. Run from the repository root:
    .venv/bin/python scripts/screenshot_dagster.py
(needs Debian's chromium, `scripts/test-setup --install`, and the `serve` extra's websockets)
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gate_pipeline.dagster_defs.jobs import play_case_run_config
from gate_pipeline.dagster_defs.webserver import free_port, graphql, launch_run, stop_process_group, wait_for_run
from gate_pipeline.kernel.settings import Settings
from gate_pipeline.store import RunStore

CASES = ["eval-clean-control-0", "eval-orphan-customer-0", "eval-amount-bounds-2"]  # the last: the pages' partition
# file under docs/ -> (page, window size, a text the page shows once loaded, what to click then or None:
# (a text of the table row, the row's button, a text the page shows after the click))
SHOTS = {
    "dagster-asset-graph.png": ("/assets/scoreboard?view=lineage&lineageScope=upstream&lineageDepth=5", (1600, 900),
                                "revenue_mart", None),
    # tall and wide: the partition's page lists the observations' keys first, the materialization's `agent` after
    "dagster-case-partition.png": (f"/assets/agent_report?view=partitions&partition={CASES[-1]}", (2000, 2400),
                                   "latest_grade_by_agent", None),
    "dagster-case-checks.png": ("/assets/staging_batches?view=checks", (1600, 900), "batches_failing", None),
    "dagster-scoreboard.png": ("/assets/scoreboard", (1600, 1250), "refuse-all", None),
    "dagster-grading-ticks.png": ("/locations/gate/sensors/grading_sensor", (1600, 1100), "View logs",
                                  ("episodes of", "View logs", "episodes graded this tick")),
}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
CLICK = """(() => { const [row, button] = %s;
  const tr = [...document.querySelectorAll('tr')].find(r => r.innerText.includes(row));
  const b = tr && [...tr.querySelectorAll('button')].find(x => x.innerText.includes(button));
  if (b) { b.click(); return true; } return false; })()"""


def wait(predicate, timeout: float, what: str, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshot: {what}: not within {timeout:.0f} s")
        time.sleep(poll)
    return value


class Chromium:
    """Headless chromium driven over the DevTools protocol: open a page, wait until it shows a text,
    click a table row's button, capture the viewport as PNG."""

    def __init__(self, exe: str, profile: Path):
        from websockets.sync.client import connect
        self.port = free_port()
        self.proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--remote-debugging-port={self.port}",
                                      f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        page = wait(self._page, 60, "chromium's DevTools answered", poll=0.3)
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.seq = 0

    def _page(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                return next((t for t in json.loads(r.read()) if t.get("type") == "page"), None)
        except OSError:
            return None

    def call(self, method: str, **params):
        self.seq += 1
        self.ws.send(json.dumps({"id": self.seq, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=120))
            if reply.get("id") == self.seq:
                if "error" in reply:
                    raise SystemExit(f"screenshot: chromium: {method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def shows(self, text: str) -> bool:
        return bool(self.evaluate(f"!!document.body && document.body.innerText.includes({json.dumps(text)})"))

    def shot(self, url: str, size: tuple[int, int], ready: str, click, out: Path) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)
        self.call("Page.navigate", url=url)
        wait(lambda: self.shows(ready), 120, f"{url} showed {ready!r}")
        if click is not None:
            row, button, then = click
            wait(lambda: self.evaluate(CLICK % json.dumps([row, button])), 60,
                 f"clicked {button!r} on the row with {row!r}")
            wait(lambda: self.shows(then), 60, f"{url} showed {then!r}")
        time.sleep(3)  # the page's last requests drawn
        out.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.ws.close()
        stop_process_group(self.proc, first=signal.SIGTERM, grace=10)


def play(base: str) -> None:
    """The runs the pictures show, each launched as the Launchpad does and waited for."""
    runs = [("play_case", play_case_run_config(agent), {"dagster/partition": case_id})
            for case_id in CASES for agent in ("naive", "careful")]
    runs += [("nightly_benchmark", None, None)] * 2
    for job, config, tags in runs:
        run_id = launch_run(base, job, config, tags)
        status = wait_for_run(base, run_id, timeout=900)
        print(" ".join(filter(None, [job, (tags or {}).get("dagster/partition"), status])), flush=True)
        if status != "SUCCESS":
            raise SystemExit(f"screenshot: run {run_id} of {job} ended {status}")


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("screenshot: chromium not found (Debian: scripts/test-setup --install)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gate-shot-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GATE_HOME": str(work / "gate"), "GATE_CASES_DIR": str(ROOT / "cases")}
    env.pop("DAGSTER_HOME", None)
    env.pop("GATE_DB_URL", None)
    log_path = work / "gate-ui.log"
    with open(log_path, "wb") as log:
        ui = subprocess.Popen([sys.executable, "-m", "gate_pipeline.cli.main", "ui", "--port", str(port)], env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        wait(lambda: f"gate ui: {base}" in log_path.read_text(errors="replace") or ui.poll() is not None, 300,
             "gate ui printed its URL")
        if ui.poll() is not None:
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
            return 1
        play(base)
        store = RunStore(Settings(home=work / "gate"))
        wait(lambda: not store.ungraded() and store.grades_after(0), 300, "the grading sensor graded every episode")
        time.sleep(20)  # the tick after: its observations recorded, and an idle tick in the history
        graphql(base, "mutation { setNuxSeen }")  # what the UI's "Skip" does on the first visit
        browser = Chromium(chromium, work / "chromium")
        try:
            for name, (page, size, ready, click) in SHOTS.items():
                out = ROOT / "docs" / name
                browser.shot(base + page, size, ready, click, out)
                print(f"wrote docs/{name} ({out.stat().st_size} bytes) from {page}")
        finally:
            browser.close()
    finally:
        if ui.poll() is None:
            ui.send_signal(signal.SIGINT)
            ui.wait(timeout=180)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
