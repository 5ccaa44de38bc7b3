"""The `gate` command line as a user meets it: outputs, and one-line errors for bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EVAL, ROOT

GATE = str(Path(sys.executable).parent / "gate")


def gate(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_CASES_DIR", "GATE_CONTRACTS")}
    return subprocess.run([GATE, *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def one_line_error(p, text):
    assert p.returncode != 0
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gate: error:") and text in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_report_json_has_one_grade_per_case(tmp_path):
    p = gate("report", "--json", "--agents", "naive,careful-sql", cwd=tmp_path)  # the shipped split, from anywhere
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert list(out["agents"]) == ["naive", "careful-sql"]
    assert [g["case_id"] for g in out["agents"]["naive"]] == [json.loads(line)["case_id"] for line in EVAL.read_text().splitlines()]
    assert {"disposition", "report", "evidence", "inspected", "reward", "bad_batches_loaded",
            "revenue_error_usd", "ledger_intact", "finished"} <= set(out["agents"]["naive"][0])


def test_report_tables_default_to_the_classic_eval_split(tmp_path):
    p = gate("report", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("eval split: 32 cases, 64 batches, 24 defective")
    assert "reward (mean)                 0.5344        1.0000        0.3875" in p.stdout
    assert "no inspected                  0.5344        0.8500        0.3875" in p.stdout
    assert "eval-amount-bounds-2       naive $  346,264.39   correct $   41,281.06" in p.stdout


def test_attacks_table(tmp_path):
    p = gate("attacks", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["agent", "reward", "disp", "report", "evid", "insp", "bad", "loaded", "revenue", "err", "$"]
    assert lines[1].startswith("careful (target)") and "1.0000" in lines[1]
    assert any(line.startswith("profile-only") and "0.8750" in line and "105,467.75" in line for line in lines)


def test_replay_json(tmp_path):
    case_id = json.loads(EVAL.read_text().splitlines()[0])["case_id"]
    t = tmp_path / "t.jsonl"
    t.write_text(json.dumps({"case_id": case_id, "calls": [
        {"tool": "list_batches", "args": {}}, {"tool": "load_batch", "args": {"batch_id": 7}},
        {"tool": "nope"}, {"tool": "submit_report", "args": {"loaded": [], "quarantined": []}}]}) + "\n")
    p = gate("replay", "--trajectories", str(t), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["results"]) == len(out["ledger"]) == 4 and "error" in out["results"][1]
    assert "error" in out["results"][2] and [e["executed"] for e in out["ledger"]] == [True, False, False, True]
    assert out["grade"]["finished"] and out["grade"]["ledger_intact"] and out["case_id"] == case_id
    assert "rewards" not in out  # terminal mode prints no step rewards


def test_cases_generate(tmp_path):
    p = gate("cases", "generate", "--suite", "classic", "--out", str(tmp_path / "c"))
    assert p.returncode == 0 and (tmp_path / "c" / "eval_curated.jsonl").read_bytes() == EVAL.read_bytes()


@pytest.mark.parametrize("args, text", [
    (["report", "--agents", "naive,carefull"], "unknown agent 'carefull'"),
    (["report", "--agents", ","], "--agents needs at least one agent name"),
    (["report", "--cases", "nope.jsonl"], "nope.jsonl: no such case file"),
    (["report", "--bogus"], "unrecognized arguments: --bogus"),
    (["attacks", "--cases", "README.md"], "README.md:1: not JSON"),
    (["cases", "generate", "--suite", "modern"], "unknown suite 'modern'"),
    (["replay", "--trajectories", "nope.jsonl"], "nope.jsonl: no such trajectory file"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(args, text):
    one_line_error(gate(*args), text)


def test_bad_trajectory_lines(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text("{oops\n")
    one_line_error(gate("replay", "--trajectories", str(t)), "t.jsonl:1: not valid JSON")
    t.write_text(json.dumps({"case_id": "nope", "calls": []}) + "\n")
    one_line_error(gate("replay", "--trajectories", str(t)), "no case 'nope'")
    t.write_text(json.dumps({"case_id": "eval-clean-control-0", "calls": "x"}) + "\n")
    one_line_error(gate("replay", "--trajectories", str(t)), "with 'case_id' and a list 'calls'")
    t.write_text(json.dumps({"case_id": 5, "calls": []}) + "\n")
    one_line_error(gate("replay", "--trajectories", str(t)), "t.jsonl:1: 'case_id' must be a non-empty string")


def test_malformed_case_line_names_file_and_line(tmp_path):
    lines = EVAL.read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["warehouse"]
    f = tmp_path / "cases.jsonl"
    f.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    one_line_error(gate("report", "--cases", str(f)), "cases.jsonl:2")


def test_deeply_nested_json_is_one_line_not_a_traceback(tmp_path):
    t = tmp_path / "deep.jsonl"
    t.write_text("[" * 100_000 + "\n")
    one_line_error(gate("replay", "--trajectories", str(t)), "deep.jsonl:1")
    one_line_error(gate("report", "--cases", str(t)), "deep.jsonl:1")
