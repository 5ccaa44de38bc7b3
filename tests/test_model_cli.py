"""`gate run` end to end against the scripted server: tables, pass^k, resume after a real interrupt, bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate_pipeline.cli.main import main
from scripted_server import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


def gate_run(server, tmp_path, *extra, model="careful"):
    return main(["run", "--model", model, "--base-url", server.url, "--runs-dir", str(tmp_path), *extra])


def test_gate_run_prints_the_tables_and_pass_hat_k(server, tmp_path, capsys):
    assert gate_run(server, tmp_path, "-n", "3", "-r", "2", "-c", "4", "--run-id", "t1") == 0
    out = capsys.readouterr().out
    assert "run t1: 6 rollouts (6 played now, 0 kept from before)" in out
    assert "ended: reported 6, max_turns 0, timeout 0, api_error 0" in out
    assert "eval x 2 rollouts split: 6 cases" in out and "reward (mean)" in out
    assert out.splitlines()[-1].split() == ["all", "3", "1.0000", "1.0000"]
    assert "pass^2" in out
    assert len((tmp_path / "t1" / "transcripts.jsonl").read_text().splitlines()) == 6


def test_gate_run_json(server, tmp_path, capsys):
    assert gate_run(server, tmp_path, "-n", "2", "--run-id", "j", "--json", model="silent") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run_id"] == "j" and doc["pass"]["all"] == {"cases": 2, "pass@1": 0.0, "pass^1": 0.0}
    assert doc["summary"]["agents"]["silent"]["finished"] == 0


def test_an_interrupted_gate_run_resumes_with_the_same_run_id(server, tmp_path, capsys):
    server.delay = 0.03
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gate_pipeline.cli.main", "run", "--model", "careful",
                                 "--base-url", server.url, "-n", "8", "-c", "1", "--run-id", "ir",
                                 "--runs-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        path = tmp_path / "ir" / "transcripts.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (path.exists() and len(path.read_text().splitlines()) >= 2):
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        server.delay = 0.0
    assert proc.returncode == 130 and err.strip().endswith("gate: interrupted")
    done = len(path.read_text().splitlines())
    assert 2 <= done < 8
    assert gate_run(server, tmp_path, "-n", "8", "--run-id", "ir") == 0
    out = capsys.readouterr().out
    assert f"run ir: 8 rollouts ({8 - done} played now, {done} kept from before)" in out
    assert len(path.read_text().splitlines()) == 8


@pytest.mark.parametrize("flags,needle", [
    (["-r", "0"], "-r must be more than 0"),
    (["-c", "many"], "-c must be a whole number"),
    (["-n", "-1"], "-n must be more than 0"),
    (["--timeout", "nan"], "--timeout must be more than 0"),
    (["--max-turns", "0"], "--max-turns must be more than 0"),
    (["--run-id", "../escape"], "run id '../escape'"),
    (["--api-key-env", "GATE_SURELY_UNSET_VAR"], "GATE_SURELY_UNSET_VAR: that environment variable is not set"),
    (["--cases", "/nonexistent/cases.jsonl"], "cases.jsonl"),
    (["--temperature", "warm"], "temperature"),
])
def test_bad_input_is_one_line_and_exit_2(server, tmp_path, capsys, flags, needle):
    assert gate_run(server, tmp_path, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error:") and needle in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_a_bad_base_url_is_one_line(tmp_path, capsys):
    assert main(["run", "--model", "m", "--base-url", "localhost:8000", "--runs-dir", str(tmp_path)]) == 2
    assert "base_url must start with http:// or https://" in capsys.readouterr().err


def test_resuming_with_another_model_is_refused(server, tmp_path, capsys):
    assert gate_run(server, tmp_path, "-n", "1", "--run-id", "same") == 0
    assert gate_run(server, tmp_path, "-n", "1", "--run-id", "same", model="silent") == 2
    assert "use another --run-id" in capsys.readouterr().err


def test_a_run_the_endpoint_never_answered_says_so_and_exits_1(tmp_path, capsys):
    rc = main(["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "-n", "2", "--retries", "0",
               "--run-id", "down", "--runs-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 1 and "ended: reported 0, max_turns 0, timeout 0, api_error 2" in captured.out
    assert "2 of 2 rollouts ended on an API error or timeout" in captured.err
    assert "--run-id down retries only those" in captured.err
