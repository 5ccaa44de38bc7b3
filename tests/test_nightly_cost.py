"""What keeps the nightly's cost near the engine's: the case file checked once per process (and again
when its text changes), the chunk size from the case count, and the classic rows checked a batch at a
time with the row-by-row check naming any problem exactly as before."""
from __future__ import annotations

import copy
import gc
import json
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.dagster_defs import scoreboard
from gate_pipeline.kernel.cases import CaseError, read_cases, write_cases
from gate_pipeline.suites.classic import cases as classic_cases

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"


def test_the_case_file_is_checked_once_and_again_when_its_text_changes(tmp_path):
    path = write_cases(tmp_path / "night.jsonl", read_cases(EVAL)[:3])
    first = scoreboard._cases(str(path))
    assert scoreboard._cases(str(path)) is first  # every step of the night: the same checked cases
    write_cases(path, read_cases(EVAL)[3:6])  # a file rewritten between two nights (same name)
    again = scoreboard._cases(str(path))
    assert again is not first and [c.case_id for c in again] == [c.case_id for c in read_cases(EVAL)[3:6]]
    lines = path.read_text().splitlines()
    broken = json.loads(lines[0])
    broken["batches"][0]["rows"][0]["amount"] = 7  # not a string: the file no longer passes
    path.write_text("\n".join([json.dumps(broken)] + lines[1:]) + "\n")
    with pytest.raises(dg.Failure, match="must be strings"):
        scoreboard._cases(str(path))  # never the cases read before the file changed


@pytest.mark.parametrize("cases, size", [(1, 8), (32, 8), (64, 8), (65, 9), (320, 40), (10_000, 1250)])
def test_the_chunk_size_follows_the_case_count(cases, size):
    assert scoreboard.chunk_size_for(cases) == size
    assert -(-cases // size) <= scoreboard.AUTO_STEPS


def _slow_problem(rows, table):
    """What the row-by-row check alone says of the rows (None: nothing)."""
    fine = classic_cases._rows_fine
    classic_cases._rows_fine = lambda rows, table: False  # the batch-at-once check says "look"
    try:
        classic_cases.check_rows(rows, table, "w")
    except CaseError as exc:
        return str(exc)
    finally:
        classic_cases._rows_fine = fine
    return None


MUTATIONS = {
    "long text": lambda r: r.update(email="x" * 101),
    "too long": lambda r: r.update(email="x" * 100_001),
    "non-ASCII": lambda r: r.update(email="é@x.com"),
    "lone surrogate": lambda r: r.update(email="\ud800"),
    "a number": lambda r: r.update(customer_id=5),
    "a null": lambda r: r.update(email=None) if "email" in r else r.update(status=None),
    "a list": lambda r: r.update(customer_id=["C1"]),
    "extra column": lambda r: r.update(extra="1"),
    "missing column": lambda r: r.pop("email"),
    "NaN amount": lambda r: r.update(amount="nan") if "amount" in r else r.update(email="a"),
    "huge amount": lambda r: r.update(amount="1e16") if "amount" in r else r.update(email="a"),
    "blank amount": lambda r: r.update(amount=" ") if "amount" in r else r.update(email="a"),
    "padded amount": lambda r: r.update(amount=" 12.5\t") if "amount" in r else r.update(email="a"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_rows_checked_at_once_pass_or_fail_as_row_by_row(mutation):
    """Whatever the batch-at-once check lets through, the row-by-row check finds nothing in either; what it
    sends row by row gets the row-by-row verdict (so every message is the one it was)."""
    verdicts = set()
    for case in read_cases(EVAL)[:8]:
        for table in ("customers", "orders"):
            rows = copy.deepcopy(case.data["warehouse"][table])
            for k in (0, len(rows) - 1):
                mutated = copy.deepcopy(rows)
                if not mutated:
                    continue
                if "email" not in mutated[k] and mutation in ("long text", "too long", "non-ASCII", "lone surrogate",
                                                              "missing column"):
                    mutated[k]["currency"] = {"long text": "x" * 101, "too long": "x" * 100_001,
                                              "non-ASCII": "é", "lone surrogate": "\ud800"}.get(mutation, "USD")
                    if mutation == "missing column":
                        mutated[k].pop("currency")
                else:
                    MUTATIONS[mutation](mutated[k])
                slow = _slow_problem(mutated, table)
                if classic_cases._rows_fine(mutated, table):
                    assert slow is None, (mutation, slow)
                try:
                    classic_cases.check_rows(mutated, table, "w")
                    fast = None
                except CaseError as exc:
                    fast = str(exc)
                assert fast == slow, (mutation, table)
                verdicts.add(fast is None)
    # a long or non-ASCII text and a blank or padded amount are fine; everything else is refused (an amount
    # only where the table has one)
    if mutation in ("long text", "non-ASCII", "blank amount", "padded amount", "a null"):
        assert verdicts == {True}, mutation
    else:
        assert False in verdicts, mutation


@pytest.mark.slow
def test_gate_nightly_checks_its_case_file_once(tmp_path, monkeypatch, capsys):
    """`gate nightly` checks its file before Dagster starts; the night's plan and chunks, in the same
    process, do not check it again (and the night is still `gate report`'s)."""
    from gate_pipeline.cli.main import main
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    path = write_cases(tmp_path / "two.jsonl", read_cases(EVAL)[:2])
    checked = []
    real = scoreboard.cases_of_text
    monkeypatch.setattr(scoreboard, "cases_of_text", lambda *a: checked.append(a) or real(*a))
    collecting = []  # the collector is paused while the imports run, and on again to play
    real_play = scoreboard.play_cases
    monkeypatch.setattr(scoreboard, "play_cases", lambda *a, **k: collecting.append(gc.isenabled()) or real_play(*a, **k))
    assert main(["nightly", "--cases", str(path), "--agents", "naive,careful", "--json"]) == 0
    night = json.loads(capsys.readouterr().out)
    assert checked == []  # every step found the cases the command had checked
    assert collecting and all(collecting) and gc.isenabled()  # played with it on; on when the command is done
    assert gc.get_freeze_count() == 0  # nothing left frozen: main() was given its arguments, the process goes on
    assert main(["report", "--cases", str(path), "--agents", "naive,careful", "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)["agents"]
    assert {a: s["reward"] for a, s in night["agents"].items()} == \
        {a: sum(g["reward"] for g in gs) / len(gs) for a, gs in reported.items()}


@pytest.mark.slow
def test_gate_nightly_draws_its_page_in_a_process_of_its_own_and_freezes_its_heap_to_end(tmp_path):
    """The command's own process never imports matplotlib (its page process does, and draws the page), and, about
    to end, freezes its heap so that the interpreter does not walk it again while tearing it down."""
    import os
    import subprocess
    import sys
    path = write_cases(tmp_path / "two.jsonl", read_cases(EVAL)[:2])
    code = ("import gc, sys\n"
            "from gate_pipeline.cli.main import main\n"
            "sys.argv = ['gate', 'nightly', '--cases', sys.argv[1], '--agents', 'naive,careful', '--json']\n"
            "code = main()\n"
            "print(code, 'matplotlib' in sys.modules, gc.get_freeze_count() > 0)\n")
    env = {**os.environ, "GATE_HOME": str(tmp_path / "gate")}
    env.pop("GATE_DB_URL", None)
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "0 False True"
    page = (tmp_path / "gate" / "scoreboard.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count('<svg class="chart"') == 2 and "night 1:" in page


def test_a_nights_steps_share_one_checked_store(tmp_path):
    """The stores a night's steps open `once` share one engine (and are not checked again); another store
    URL gets its own; a store opened without `once` is checked, and closed by `dispose`, as ever."""
    from gate_pipeline import store as store_module
    from gate_pipeline.kernel.settings import Settings
    from gate_pipeline.store import SHARED_ENGINES, RunStore, StoreError

    def settings(name):
        return Settings(home=tmp_path / name)

    first = RunStore(settings("a"), once=True)
    first.dispose()
    again = RunStore(settings("a"), once=True)
    assert again.engine is first.engine and again.count_episodes() == 0
    assert RunStore(settings("a")).engine is not first.engine
    others = [RunStore(settings(f"o{i}"), once=True) for i in range(SHARED_ENGINES)]
    assert len({id(s.engine) for s in others}) == SHARED_ENGINES
    assert RunStore(settings("a"), once=True).engine is not first.engine  # the oldest made way
    assert len(store_module._ENGINES) <= SHARED_ENGINES
    with pytest.raises(StoreError, match="is not the key"):  # another key: checked again, refused
        RunStore(Settings(home=tmp_path / "a", store_key="another-key-0123456789abcdef0123456789"), once=True)
