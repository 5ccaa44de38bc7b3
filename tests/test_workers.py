"""Cases played in forked worker processes (`engine.play_cases(..., workers=N)`, `gate report --workers N`): the
same results as one process, whatever the case file or the agent does, and no worker, pipe or descriptor left
behind. (Each test here is an outside review's finding; tests/test_hostile_input.py holds the earlier ones.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate_pipeline.kernel.cases import CaseError, CaseLines, read_cases
from gate_pipeline.kernel.engine import play_cases

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
V2 = ROOT / "cases" / "v2" / "train_procedural.jsonl"

@pytest.mark.parametrize("source,path,first,then", [
    (EVAL, ("limits", "max_amount"), 1, True),
    (V2, ("row_quarantine", "max_rows"), 5, 5.0),
], ids=["classic: true after 1", "v2: 5.0 after 5"])
def test_a_contract_equal_in_value_to_the_one_before_but_not_in_type_is_checked(tmp_path, source, path, first, then):
    """A case whose contract equals the one of the case before it is not checked again; equal was Python's `==`, for
    which `true == 1` and `5.0 == 5`: a contract refused on its own line was accepted after an equal-valued one (and,
    with workers, accepted or not by how deep in its stack a worker re-read the line before)."""
    lines = source.read_text().splitlines()[:2]
    cases = [json.loads(line) for line in lines]
    for case, value in zip(cases, (first, then)):
        case["contract"][path[0]][path[1]] = value
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(cases[1]) + "\n")
    with pytest.raises(CaseError) as refused:
        read_cases(alone)
    both = tmp_path / "both.jsonl"
    both.write_text("".join(json.dumps(c) + "\n" for c in cases))
    with pytest.raises(CaseError) as after:
        read_cases(both)
    assert str(refused.value).startswith(f"{alone}:1 ") and str(after.value).startswith(f"{both}:2 "), after.value
    assert str(after.value)[len(f"{both}:2"):] == str(refused.value)[len(f"{alone}:1"):]
    for workers in (1, 2):
        with pytest.raises(CaseError) as shared:
            play_cases(CaseLines.read(both), ["naive"], workers=workers)
        assert str(shared.value) == str(after.value)


def test_a_contract_before_a_share_is_read_as_deep_as_anywhere(tmp_path):
    """A worker re-reads the line before its share for its contract; it did so with `json.loads`, which stops at the
    recursion limit counted from the worker's deeper stack: a line nested 975 deep was then no contract, and the
    share's first contract was checked where the whole file's reading skips it. Both now read it alike."""
    from gate_pipeline.kernel import cases as cases_module
    lines = EVAL.read_text().splitlines()[:2]
    first = json.dumps(json.loads(lines[0]))
    at = first.index('"truth": {') + len('"truth": {')
    text = first[:at] + '"deep": ' + "[" * 975 + "]" * 975 + ", " + first[at:] + "\n" + lines[1] + "\n"
    checked = []
    real = cases_module.load_case

    def counting(obj, where="case", contract_checked=False):
        checked.append(contract_checked)
        return real(obj, where, contract_checked)

    def deep(levels, fn):  # a reader 400 frames deeper than this test
        return fn() if levels == 0 else deep(levels - 1, fn)

    try:
        cases_module.load_case = counting
        whole = CaseLines(text, "x.jsonl")
        whole.parsed()
        lines_read = CaseLines(text, "x.jsonl")
        deep(400, lambda: lines_read.share(1, 2))
    finally:
        cases_module.load_case = real
    assert checked == [False, True, True]
