"""The HTML page from every command that prints tables: gate run, gate nightly, the scoreboard asset."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EVAL

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.cases import read_cases, write_cases


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    return tmp_path / "gate"


def _is_page(path: Path, *texts):
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") >= 2
    for t in texts:
        assert t in html


def test_gate_nightly_html_and_the_scoreboard_page(home, tmp_path, capsys):
    small = tmp_path / "eval_small.jsonl"
    write_cases(small, read_cases(EVAL)[:3])
    page = tmp_path / "nightly.html"
    assert main(["nightly", "--cases", str(small), "--agents", "naive,careful", "--html", str(page)]) == 0
    _is_page(page, "gate nightly scoreboard", "reward (mean)")
    _is_page(home / "scoreboard.html", "night 1:")
    assert main(["nightly", "--cases", str(small), "--agents", "naive"]) == 0
    _is_page(home / "scoreboard.html", "night 2:")


def test_a_scoreboard_page_that_cannot_be_written_is_one_line_and_the_night_is_kept(home, tmp_path, capsys):
    """The page's process cannot write GATE_HOME/scoreboard.html (a folder stands there): `gate nightly` says so
    in one line and exits 2; the night was played, stored and sealed before the page, and verifies."""
    small = tmp_path / "eval_small.jsonl"
    write_cases(small, read_cases(EVAL)[:2])
    (home / "scoreboard.html").mkdir(parents=True)
    assert main(["nightly", "--cases", str(small), "--agents", "naive", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the scoreboard page" in err and "cannot write (Is a directory)" in err
    assert main(["verify"]) == 0 and capsys.readouterr().out.rstrip().endswith("every check holds")


def test_gate_run_html_carries_pass_k(tmp_path, capsys):
    from scripted_server import ScriptedServer
    page = tmp_path / "run.html"
    with ScriptedServer() as server:
        assert main(["run", "--model", "scripted", "--base-url", server.url, "--runs-dir", str(tmp_path),
                     "-n", "2", "-r", "2", "--run-id", "h", "--html", str(page)]) == 0
    _is_page(page, "gate run h", "pass^2")


@pytest.mark.parametrize("cmd", [["nightly"], ["report"], ["experiment"],
                                 ["run", "--model", "m", "--base-url", "http://127.0.0.1:9"]])
def test_a_bad_html_path_fails_before_any_work(cmd, tmp_path, capsys, home):
    assert main([*cmd, "--html", str(tmp_path / "no" / "such" / "dir.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
