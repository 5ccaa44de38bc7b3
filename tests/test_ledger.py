"""The hash-chained ledger: the spec's test vector, and tampering of every kind detected."""
from __future__ import annotations

import copy
import json

from gate_pipeline.agents import make_agent
from gate_pipeline.grader import grade, grade_record
from gate_pipeline.ledger import Ledger, canonical_json, chain_intact, entry_hash
from gate_pipeline.runner import play


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
    g, ep = play(prepared[case_id], make_agent(agent), keep_episode=True)
    return g, ep


def test_an_honest_ledger_is_intact(prepared):
    g, ep = _played(prepared)
    assert g["ledger_intact"] and chain_intact(ep.ledger.entries) and len(ep.ledger.entries) > 5
    ep.close()


def test_edited_argument_breaks_the_chain(prepared):
    _, ep = _played(prepared)
    entries = copy.deepcopy(ep.ledger.entries)
    loads = [e for e in entries if e["action"] == "load_batch"]
    loads[0]["args"]["batch_id"] = "B-other"
    assert not chain_intact(entries)
    ep.close()


def test_deleted_entry_breaks_the_chain(prepared):
    _, ep = _played(prepared)
    entries = copy.deepcopy(ep.ledger.entries)
    del entries[3]
    assert not chain_intact(entries)
    ep.close()


def test_swapped_entries_break_the_chain(prepared):
    _, ep = _played(prepared)
    entries = copy.deepcopy(ep.ledger.entries)
    entries[2], entries[3] = entries[3], entries[2]
    assert not chain_intact(entries)
    ep.close()


def test_rehashed_forgery_still_breaks_the_links(prepared):
    """Editing an entry and recomputing its own hash leaves the next entry's prev_hash dangling."""
    _, ep = _played(prepared)
    entries = copy.deepcopy(ep.ledger.entries)
    e = entries[2]
    e["executed"] = not e["executed"]
    e["hash"] = entry_hash({k: e[k] for k in ("seq", "action", "args", "executed", "note", "prev_hash")})
    assert not chain_intact(entries)
    ep.close()


def test_grade_of_a_tampered_ledger_says_so(prepared):
    g, ep = _played(prepared)
    p = ep.prepared
    entries = copy.deepcopy(ep.ledger.entries)
    entries[-1]["args"]["quarantined"] = []
    forged = grade_record(p.case, entries, ep.world.revenue(), p.correct_mart)
    assert g["ledger_intact"] and not forged["ledger_intact"]
    assert grade(ep)["ledger_intact"]
    ep.close()


def test_a_mangled_stored_ledger_is_graded_not_crashed(prepared):
    _, ep = _played(prepared)
    p = ep.prepared
    entries = copy.deepcopy(ep.ledger.entries)
    entries[1] = "not an entry"
    entries[2]["args"] = None
    entries[-1]["args"]["loaded"] = 5
    g = grade_record(p.case, entries, ep.world.revenue(), p.correct_mart)
    assert not g["ledger_intact"] and not g["finished"] and g["reward"] == 0.0
    ep.close()


def test_the_fast_body_encoding_is_json_dumps_on_every_real_entry(prepared):
    """Ledger hashes spell the body out for speed; on every entry the agents write, the bytes
    must be exactly json.dumps(body, sort_keys=True)."""
    from gate_pipeline.agents import ATTACKERS, BASELINES
    from gate_pipeline.ledger import _body_json
    n = 0
    for case_id in list(prepared)[::4]:
        for name in [*BASELINES, *ATTACKERS]:
            _, ep = play(prepared[case_id], make_agent(name), keep_episode=True)
            for e in ep.ledger.entries:
                body = {k: e[k] for k in ("seq", "action", "args", "executed", "note", "prev_hash")}
                assert _body_json(**body) == json.dumps(body, sort_keys=True)
                n += 1
            ep.close()
    odd = {"seq": 0, "action": "run_sql", "args": {"query": "SELECT '\u00e9\\\\\"'", "tables_read": []},
           "executed": False, "note": "caf\u00e9", "prev_hash": "genesis"}
    assert _body_json(**odd) == json.dumps(odd, sort_keys=True)
    assert n > 1000


def test_unusual_field_types_still_hash_like_json_dumps():
    from gate_pipeline.ledger import _fields_hash
    body = {"seq": 0, "action": "x", "args": [], "executed": 1, "note": None, "prev_hash": "genesis"}
    expect = __import__("hashlib").sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    assert _fields_hash(**body) == expect
