"""`gate cases export`: the cases as a Hugging Face dataset (parquet, both splits, both suites) loaded back with
`datasets`, and transcripts as chat-with-tools SFT data, chosen by the run store's grades, never the transcript's."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from scripted_server import ScriptedServer

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.suite import suites
from gate_pipeline.model_agent.tool_schemas import tool_schemas

datasets = pytest.importorskip("datasets", reason="the 'hf' extra is not installed")
ROOT = Path(__file__).resolve().parent.parent



def test_hf_export_round_trips_every_suite_and_split(tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["cases", "export", "--format", "hf", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 * len(suites.names())
    for name in suites.names():
        loaded = datasets.load_dataset(str(out), name, cache_dir=str(tmp_path / "cache"))  # not a cache an earlier export of the same folder name filled
        assert set(loaded) == {"train", "eval"}
        suite = suites.get(name)
        for split, ds in loaded.items():
            cases = read_cases(ROOT / "cases" / name / ("eval_curated.jsonl" if split == "eval"
                                                       else "train_procedural.jsonl"))
            assert ds["case_id"] == [c.case_id for c in cases] and ds["family"] == [c.family for c in cases]
            row = ds[0]
            assert row["suite"] == name and row["split"] == split and row["system_prompt"] == suite.prompt
            assert row["prompt"] == [{"role": "system", "content": suite.prompt},
                                     {"role": "user", "content": "Tonight's batches are in staging. Begin."}]
            assert json.loads(row["tools"]) == tool_schemas(suite)
            assert row["task"] == cases[0].prompt and row["batches"] == len(cases[0].batches)
            text = json.dumps(ds.to_list())
            assert '"label"' not in text and "truth" not in text  # no truth label rides along
    assert datasets.Dataset.from_parquet(str(out / "classic" / "eval.parquet")).num_rows == 32


def test_hf_export_of_one_suite_and_bad_input(tmp_path, capsys):
    assert main(["cases", "export", "--format", "hf", str(tmp_path / "one"), "--suite", "v2"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["README.md", "v2"]
    capsys.readouterr()
    (tmp_path / "file").write_text("x")
    for argv, needle in ((["--format", "hf", str(tmp_path / "file")], "is not a directory"),
                         (["--format", "hf", str(tmp_path / "x"), "--suite", "nope"], "unknown suite"),
                         (["--format", "csv", str(tmp_path / "x")], "--format"),
                         (["--format", "jsonl-chat", str(tmp_path / "x.jsonl")], "--run"),
                         (["--format", "jsonl-chat", str(tmp_path / "x.jsonl"), "--run", str(tmp_path)],
                          "no transcripts.jsonl"),
                         (["--format", "jsonl-chat", str(tmp_path / "x.jsonl"), "--run", "r", "--min-reward", "2"],
                          "--min-reward"),
                         (["--format", "hf", str(tmp_path / "y"), "--run", "r"], "--run goes with")):
        assert main(["cases", "export", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gate: error:") and needle in err, (argv, err)


def test_jsonl_chat_export_takes_the_stores_grades_not_the_transcripts(tmp_path, capsys, home):
    with ScriptedServer() as server:
        for model in ("coin", "scripted"):
            assert main(["run", "--model", model, "--base-url", server.url, "-n", "4", "-r", "2", "--run-id", model,
                         "--runs-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "sft.jsonl"
    runs = ["--run", str(tmp_path / "coin"), "--run", str(tmp_path / "scripted")]
    assert main(["cases", "export", "--format", "jsonl-chat", str(out), *runs]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: 16 conversations"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 16
    for row in rows:
        assert row["messages"][0]["role"] == "system" and row["messages"][-1]["role"] == "tool"
        assert any(m.get("tool_calls") for m in row["messages"] if m["role"] == "assistant")
        assert row["tools"] == tool_schemas(suites.default())
    passes = sum(1 for r in rows if r["reward"] == 1.0)
    # a transcript that claims a pass is not believed: every coin line raised to 1.0 changes nothing
    path = tmp_path / "coin" / "transcripts.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line["reward"] = line["grade"]["reward"] = 1.0
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["cases", "export", "--format", "jsonl-chat", str(out), *runs, "--min-reward", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"{out}: {passes} conversations ({16 - passes} below --min-reward left out)" in printed
    # a stored episode cut short does not check, and is left out
    victim = json.loads((tmp_path / "scripted" / "transcripts.jsonl").read_text().splitlines()[0])["episode_id"]
    sqlite3.connect(home / "runs.db", isolation_level=None).execute(
        "DELETE FROM ledger_entries WHERE episode_id = ? AND seq > 3", (victim,))
    assert main(["cases", "export", "--format", "jsonl-chat", str(out), "--run", str(tmp_path / "scripted")]) == 0
    assert "7 conversations (1 does not check left out)" in capsys.readouterr().out


def test_hf_export_refuses_what_it_did_not_write_before_writing_anything(tmp_path, capsys):
    """It overwrote a README.md of someone else's (or the file a link there named) and waited for ever on a FIFO
    where a parquet file goes."""
    import os
    out = tmp_path / "hf"
    (out / "classic").mkdir(parents=True)
    (out / "README.md").write_text("precious\n")
    assert main(["cases", "export", "--format", "hf", str(out), "--suite", "classic"]) == 2
    assert "a file is there that gate did not write" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "precious\n" and not (out / "classic" / "eval.parquet").exists()
    (out / "README.md").unlink()
    os.mkfifo(out / "classic" / "eval.parquet")
    assert main(["cases", "export", "--format", "hf", str(out), "--suite", "classic"]) == 2
    assert "is not a regular file" in capsys.readouterr().err
    (out / "classic" / "eval.parquet").unlink()
    assert main(["cases", "export", "--format", "hf", str(out), "--suite", "classic"]) == 0
    assert main(["cases", "export", "--format", "hf", str(out), "--suite", "classic"]) == 0  # its own files: again
