"""Render `gate report --html` for the README and screenshot it with headless Debian chromium.

    .venv/bin/python scripts/screenshot_report.py [--agents naive,careful,refuse-all] [--out docs/report.png]
    .venv/bin/python scripts/screenshot_report.py --experiment --out docs/experiment.png   # gate experiment --html

Runs from the project root (case paths as the README shows them); prints the PNG's path.
`--html FILE` keeps the page too. Needs `chromium` on PATH.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gate_pipeline.cli.main import main as gate

ROOT = Path(__file__).resolve().parent.parent


def screenshot(html: Path, png: Path, width: int, height: int) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("screenshot_report: chromium not found (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run(
            [chromium, "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={png}",
             html.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    if run.returncode != 0 or not png.exists():
        sys.exit(f"screenshot_report: chromium failed ({run.returncode}): {run.stderr.strip()[-500:]}")


def cli() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="cases/classic/eval_curated.jsonl")
    p.add_argument("--agents", default="naive,careful,refuse-all")
    p.add_argument("--out", default=str(ROOT / "docs/report.png"))
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1500)
    p.add_argument("--html", default=None, help="keep the rendered page here")
    p.add_argument("--experiment", action="store_true", help="screenshot `gate experiment --html` instead")
    a = p.parse_args()
    png = Path(a.out).resolve()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(a.html).resolve() if a.html else Path(tmp) / "report.html"
        command = ["experiment"] if a.experiment else ["report", "--agents", a.agents]
        code = gate([*command, "--cases", a.cases, "--html", str(html)])
        if code:
            return code
        screenshot(html, png, a.width, a.height)
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
