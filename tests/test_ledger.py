"""The hash-chained ledger: the spec's test vector, and tampering of every kind detected."""
from __future__ import annotations

import copy
import hashlib
import json

from gate_pipeline.kernel.engine import play
from gate_pipeline.kernel.grading import grade
from gate_pipeline.kernel.ledger import GENESIS, Ledger, canonical_json, chain_intact, entry_hash, last_hash
from gate_pipeline.kernel.suite import suites


def grade_record(case, entries, mart, correct, failure="", intact=None):
    """The grade of a case's ledger and mart, by its suite's rubric."""
    return suites.get(case.suite).rubric.grade(case, entries, mart, correct, failure, intact)


def test_spec_test_vector():
    ledger = Ledger()
    e = ledger.append("list_batches", {}, True)
    assert e["prev_hash"] == "genesis" and e["seq"] == 0
    assert e["hash"] == "443372b4ed9824c8d3adec84fc482b6aba0ef7bc4a9f34bae391ea8fa54ca770"


def test_canonical_json_is_json_dumps_sorted():
    body = {"seq": 1, "action": "run_sql", "args": {"query": "SELECT 'é' -- \u2603", "tables_read": ["a"]},
            "executed": False, "note": "OperationalError", "prev_hash": "x"}
    assert canonical_json(body) == json.dumps(body, sort_keys=True)
    assert entry_hash(body) == __import__("hashlib").sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _played(prepared, case_id="eval-resent-rows-0", agent="careful-sql"):
    """One finished episode (engine.play): its grade, ledger entries and prepared case."""
    return play(prepared[case_id], agent)


def test_an_honest_ledger_is_intact(prepared):
    r = _played(prepared)
    assert r.grade.ledger_intact and chain_intact(r.ledger) and len(r.ledger) > 5


def test_edited_argument_breaks_the_chain(prepared):
    r = _played(prepared)
    entries = copy.deepcopy(r.ledger)
    loads = [e for e in entries if e["action"] == "load_batch"]
    loads[0]["args"]["batch_id"] = "B-other"
    assert not chain_intact(entries)


def test_deleted_entry_breaks_the_chain(prepared):
    r = _played(prepared)
    entries = copy.deepcopy(r.ledger)
    del entries[3]
    assert not chain_intact(entries)


def test_swapped_entries_break_the_chain(prepared):
    r = _played(prepared)
    entries = copy.deepcopy(r.ledger)
    entries[2], entries[3] = entries[3], entries[2]
    assert not chain_intact(entries)


def test_rehashed_forgery_still_breaks_the_links(prepared):
    """Editing an entry and recomputing its own hash leaves the next entry's prev_hash dangling."""
    r = _played(prepared)
    entries = copy.deepcopy(r.ledger)
    e = entries[2]
    e["executed"] = not e["executed"]
    e["hash"] = entry_hash({k: e[k] for k in ("seq", "action", "args", "executed", "note", "prev_hash")})
    assert not chain_intact(entries)


def test_grade_of_a_tampered_ledger_says_so(prepared):
    r = _played(prepared)
    p = prepared[r.case_id]
    entries = copy.deepcopy(r.ledger)
    entries[-1]["args"]["quarantined"] = []
    forged = grade_record(p.case, entries, r.grade.revenue, p.correct_mart)
    assert r.grade.ledger_intact and not forged.ledger_intact
    # the episode's own entries are untouched: graded again, they give the episode's grade
    again = grade_record(p.case, r.ledger, r.grade.revenue, p.correct_mart)
    assert again == r.grade and again.ledger_intact


def test_grade_of_a_live_episode_reads_its_own_ledger(prepared):
    p = prepared["eval-resent-rows-0"]
    ep = p.suite.episode(p)
    for b in p.order:
        ep.call("profile_batch", {"batch_id": b})
    ep.call("submit_report", {"loaded": [], "quarantined": []})
    assert grade(ep).ledger_intact
    ep.ledger.entries[0]["args"]["batch_id"] = "B-other"
    assert not grade(ep).ledger_intact
    ep.close()


def test_a_mangled_stored_ledger_is_graded_not_crashed(prepared):
    r = _played(prepared)
    p = prepared[r.case_id]
    entries = copy.deepcopy(r.ledger)
    entries[1] = "not an entry"
    entries[2]["args"] = None
    entries[-1]["args"]["loaded"] = 5
    g = grade_record(p.case, entries, r.grade.revenue, p.correct_mart)
    assert not g.ledger_intact and not g.finished and g.reward == 0.0


def _dumps_hash(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def test_the_fast_body_encoding_is_json_dumps_on_every_real_entry(prepared):
    """Ledger hashes spell the body out for speed (`_fields_hash`); on every entry the agents
    write, the hashed bytes must be exactly json.dumps(body, sort_keys=True)."""
    from gate_pipeline.kernel.ledger import _fields_hash
    from gate_pipeline.suites.classic import ATTACKERS, BASELINES
    n = 0
    for case_id in list(prepared)[::4]:
        for name in [*BASELINES, *ATTACKERS]:
            for e in play(prepared[case_id], name).ledger:
                body = {k: e[k] for k in ("seq", "action", "args", "executed", "note", "prev_hash")}
                assert canonical_json(body) == json.dumps(body, sort_keys=True)
                assert _fields_hash(**body) == _dumps_hash(body) == e["hash"]
                n += 1
    odd = {"seq": 0, "action": "run_sql", "args": {"query": "SELECT '\u00e9\\\\\"'", "tables_read": []},
           "executed": False, "note": "caf\u00e9", "prev_hash": "genesis"}
    assert _fields_hash(**odd) == _dumps_hash(odd)
    assert n > 1000


def test_unusual_field_types_still_hash_like_json_dumps():
    from gate_pipeline.kernel.ledger import _fields_hash
    body = {"seq": 0, "action": "x", "args": [], "executed": 1, "note": None, "prev_hash": "genesis"}
    assert _fields_hash(**body) == _dumps_hash(body)


def test_the_listener_sees_each_entry_as_it_is_appended():
    seen = []
    ledger = Ledger(listener=lambda entry: seen.append((entry, len(ledger.entries))))
    assert last_hash(ledger.entries) == GENESIS
    ledger.append("list_batches", {}, True)
    ledger.append("load_batch", {"batch_id": "B-1"}, False, "unknown batch")
    assert [e for e, _ in seen] == ledger.entries and [n for _, n in seen] == [1, 2]
    assert last_hash(ledger.entries) == ledger.entries[-1]["hash"] and chain_intact(ledger.entries)


def test_a_ledger_nobody_watched_is_chained_when_first_read(prepared):
    """An episode whose entries no sink watched hands its ledger over unchained; the chain is computed the
    first time the entries are read, and is the chain a ledger hashed as it was written has."""
    from gate_pipeline.kernel.engine import Session, Sink

    class Watching(Sink):
        wants_entries = True

    p = prepared["eval-resent-rows-0"]
    lazy, eager = play(p, "careful-sql"), play(p, "careful-sql", sinks=[Watching()])
    assert isinstance(lazy.chain, Ledger) and lazy.chain.deferred and isinstance(eager.chain, list)
    assert all(e["hash"] is None for e in lazy.chain.entries)
    assert lazy.grade == eager.grade and lazy.grade.ledger_intact
    assert lazy.ledger == eager.ledger and chain_intact(lazy.ledger) and lazy.ledger[-1]["hash"]
    assert lazy.ledger is lazy.ledger  # chained once, then read as it stands
    s = Session(p, "x")
    s.call("list_batches", {})
    assert s.finish().ledger[0]["hash"] == entry_hash({k: s.result.ledger[0][k] for k in (
        "seq", "action", "args", "executed", "note", "prev_hash")})
