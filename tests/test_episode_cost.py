"""What makes an episode cheap changes nothing an episode shows: the loader's rows made in bulk and on first
use, the catalogue the compile check reuses, cases read while the first ones play."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.kernel import compile_check
from gate_pipeline.kernel.cases import CaseError, CaseStream, read_case_text, read_cases
from gate_pipeline.kernel.engine import play, play_cases, prepare
from gate_pipeline.kernel.sandbox import Sandbox
from gate_pipeline.kernel.world import connect
from gate_pipeline.suites.classic.world import _wh_rows, loader_amount

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"


@pytest.mark.parametrize("amounts", [["12.50", " 7 ", "1e3"], ["12.50", "abc", None, ""], ["nan", "-inf", "1e400", "\t3\n"]])
def test_the_loader_reads_amounts_in_bulk_as_it_reads_them_one_by_one(amounts):
    rows = [{"order_id": f"O{k}", "customer_id": "C1", "amount": a, "currency": "USD", "status": "placed",
             "order_date": "2026-09-01"} for k, a in enumerate(amounts)]
    got = _wh_rows("orders", rows)
    want = [(r["order_id"], r["customer_id"], loader_amount(r["amount"]), r["currency"], r["status"], r["order_date"])
            for r in rows]
    assert repr(got) == repr(want)  # repr: NaN equals NaN
    assert _wh_rows("orders", []) == []


def test_a_batch_s_loader_rows_are_made_when_it_is_first_loaded_and_played_as_before():
    case = next(c for c in read_cases(TRAIN) if any(b.defective for b in c.batches))
    prepared = prepare(case)
    try:
        assert prepared._load_rows == {}
        assert prepared.correct_mart is not None
        clean = {b.batch_id for b in case.batches if not b.defective}
        assert set(prepared._load_rows) == clean
        result = play(prepared, "naive")  # loads every batch, the defective ones too
        assert set(prepared._load_rows) == set(prepared.order) and result.grade.revenue != result.grade.correct_revenue
    finally:
        prepared.close()


def test_the_compile_check_is_given_the_schema_again_once_gate_changes_it():
    """The sandbox reads the catalogue for the compile check once, and again after a statement of gate's own
    that may change the schema: the check then keys on the new schema (a new child compiles it)."""
    conn = connect()
    conn.execute("CREATE TABLE stg_a (x TEXT)")
    sandbox = Sandbox(conn)
    query = "SELECT x FROM stg_a WHERE x IN (SELECT x FROM stg_a)"
    sandbox.execute(query)
    assert [name for name, _ in sandbox._catalogue] == ["stg_a"]
    sandbox.execute("SELECT 1")
    conn.execute("INSERT INTO stg_a VALUES ('1')")  # no change of schema: the catalogue stands
    assert sandbox._catalogue is not None
    conn.execute("CREATE TEMP TABLE gate_held (k TEXT)")
    assert sandbox._catalogue is None
    for check in compile_check._IDLE:
        check.close()
    sandbox._compiled = None  # (the same text just after it passed is not checked again)
    sandbox.execute(query)
    assert [name for name, _ in sandbox._catalogue] == ["stg_a", "gate_held"]
    assert any(check._child is not None for check in compile_check._IDLE)  # checked on the new schema


def _lines(path: Path) -> list[str]:
    return read_case_text(path).splitlines()


@pytest.mark.parametrize("bad", ["not json", "dup", "[]"])
def test_a_case_stream_refuses_what_read_cases_refuses_with_the_same_words(tmp_path, bad):
    lines = _lines(TRAIN)[:6]
    lines[4] = {"not json": "{nope", "dup": lines[1], "[]": "[]"}[bad]
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n")
    with pytest.raises(CaseError) as want:
        read_cases(path)
    stream = CaseStream(read_case_text(path), str(path))
    assert len(stream) == 6 and [c.case_id for c in stream.read] == [json.loads(lines[0])["case_id"]]
    with pytest.raises(CaseError) as got:
        list(stream)
    assert str(got.value) == str(want.value) and ":6:" in str(got.value)
    assert len(stream.read) == 4
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n")
    with pytest.raises(CaseError, match="no cases in file"):
        CaseStream(read_case_text(empty), str(empty))


def test_cases_read_while_worker_processes_play_are_played_as_a_list_of_them(tmp_path, capsys):
    cases = read_cases(TRAIN)[:40]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(c.line() for c in cases))
    want = play_cases(cases, ["careful-sql", "naive"])
    got = play_cases(CaseStream(read_case_text(path), str(path)), ["careful-sql", "naive"], workers=2)
    for name in want:
        assert [(r.case_id, r.grade, r.ledger) for r in got[name]] == [(r.case_id, r.grade, r.ledger) for r in want[name]]
    lines = path.read_text().splitlines()
    lines[35] = lines[35].replace('"batches": [', '"batches": 7, "x": [', 1)
    path.write_text("\n".join(lines) + "\n")
    for workers in ("1", "2"):  # a bad case late in the file: one line, exit 2, whatever the workers
        assert main(["report", "--cases", str(path), "--agents", "careful-sql", "--json", "--workers", workers]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and f"{path}:36" in captured.err
