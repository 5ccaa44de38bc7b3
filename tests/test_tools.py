"""The seven tools: exact results, every refusal with its exact text and ledger entry, and
malformed arguments refused (never coerced) without touching the warehouse."""
from __future__ import annotations

import pytest

from gate_pipeline.kernel.actions import parse_action
from gate_pipeline.kernel.ledger import chain_intact
from gate_pipeline.suites.classic.contract import COLUMNS, DEFECT_TYPES

CASE = "eval-legit-edge-2"  # an orders batch listed before its customers batch


@pytest.fixture
def ep(prepared):
    p = prepared[CASE]
    e = p.suite.episode(p)
    yield e
    e.close()


def _ids(ep):
    return {b["table"]: b["batch_id"] for b in ep.prepared.listing}


def _snapshot(ep):
    c = ep.world.conn
    return (c.execute("SELECT COUNT(*), TOTAL(amount) FROM wh_orders").fetchone(),
            c.execute("SELECT COUNT(*) FROM wh_customers").fetchone(),
            dict(ep.world.loads), dict(ep.world.quarantined), ep.world.report)


def last(ep):
    return ep.ledger.entries[-1]


def test_list_batches_has_exactly_five_keys(ep):
    listing = ep.call("list_batches")
    assert [b["batch_id"] for b in listing] == ep.prepared.order
    assert all(set(b) == {"batch_id", "table", "rows", "staging_table", "source"} for b in listing)
    assert listing[0]["staging_table"] == "stg_" + listing[0]["batch_id"].lower().replace("-", "_")


def test_profile_reports_string_min_max_and_numeric_range(ep):
    bid = _ids(ep)["orders"]
    p = ep.call("profile_batch", {"batch_id": bid})
    amount = p["columns"]["amount"]
    values = [r["amount"] for r in ep.prepared.batches[bid].data["rows"]]
    assert amount["min"] == min(values) and amount["max"] == max(values)
    assert amount["numeric_max"] == max(float(v) for v in values)
    assert list(p["columns"]) == list(COLUMNS["orders"])
    tops = p["columns"]["customer_id"]["top_values"]
    assert len(tops) <= 8 and tops == sorted(tops, key=lambda t: (-t[1], t[0]))


@pytest.mark.parametrize("tool, args", [
    ("profile_batch", {"batch_id": "B-nope"}),
    ("load_batch", {"batch_id": "B-nope"}),
    ("quarantine_batch", {"batch_id": "B-nope", "column": "amount", "defect_type": "missing_value"}),
])
def test_unknown_batch(ep, tool, args):
    before = _snapshot(ep)
    assert ep.call(tool, args) == {"error": "no batch 'B-nope'"}
    assert last(ep)["executed"] is False and last(ep)["args"]["batch_id"] == "B-nope"
    assert last(ep)["note"] == ("" if tool == "profile_batch" else "unknown batch")
    assert _snapshot(ep) == before


def test_mis_cased_batch_id_is_unknown(ep):
    bid = _ids(ep)["orders"].lower()
    assert ep.call("load_batch", {"batch_id": bid}) == {"error": f"no batch {bid!r}"}
    assert ep.world.loads == {}


def test_quarantine_refusals_in_order(ep):
    bid = _ids(ep)["orders"]
    r = ep.call("quarantine_batch", {"batch_id": bid, "column": "nope", "defect_type": "bogus"})
    assert r == {"error": f"defect_type must be one of {list(DEFECT_TYPES)}"}
    assert last(ep)["note"] == "unknown defect type"
    r = ep.call("quarantine_batch", {"batch_id": bid, "column": "email", "defect_type": "missing_value"})
    assert r == {"error": f"column must be one of {list(COLUMNS['orders'])}"}
    assert last(ep)["note"] == "unknown column"
    r = ep.call("quarantine_batch", {"batch_id": bid, "column": "amount", "defect_type": "missing_value"})
    assert r == {"status": "quarantined", "batch_id": bid}
    r = ep.call("quarantine_batch", {"batch_id": bid, "column": "status", "defect_type": "invalid_value"})
    assert r == {"error": f"{bid} is already quarantined; the first citation stands"}
    assert last(ep)["note"] == "already quarantined" and not last(ep)["executed"]
    assert ep.world.quarantined[bid] == {"column": "amount", "defect_type": "missing_value"}
    assert ep.call("load_batch", {"batch_id": bid}) == {"error": f"{bid} is quarantined"}
    assert last(ep)["note"] == "quarantined" and ep.world.loads == {}


def test_quarantine_after_load_warns_and_removes_nothing(ep):
    bid = _ids(ep)["customers"]
    assert ep.call("load_batch", {"batch_id": bid}) == {"status": "loaded", "rows_loaded": 5, "errors": 0}
    n = ep.world.conn.execute("SELECT COUNT(*) FROM wh_customers").fetchone()[0]
    r = ep.call("quarantine_batch", {"batch_id": bid, "column": "email", "defect_type": "missing_value"})
    assert r["warning"] == "already loaded - quarantine does not remove loaded rows"
    assert last(ep)["executed"] and last(ep)["note"] == r["warning"]
    assert ep.world.conn.execute("SELECT COUNT(*) FROM wh_customers").fetchone()[0] == n


def test_loader_never_complains_and_counts_orphans(ep):
    ids = _ids(ep)
    r = ep.call("load_batch", {"batch_id": ids["orders"]})
    assert r["errors"] == 0
    entry = last(ep)
    assert entry["args"]["orphan_rows"] == 3 and ep.world.orphans_at_load == {ids["orders"]: 3}
    ep.call("load_batch", {"batch_id": ids["orders"]})
    assert ep.world.loads[ids["orders"]] == 2


def test_submit_report_once(ep):
    assert ep.call("submit_report", {"loaded": ["b", "a", "a"], "quarantined": []}) == {"status": "received"}
    assert ep.world.report == {"loaded": ["a", "a", "b"], "quarantined": []}
    r = ep.call("submit_report", {"loaded": [], "quarantined": []})
    assert r == {"error": "a report was already submitted; the first one stands"}
    assert last(ep)["note"] == "already submitted" and ep.world.report["loaded"] == ["a", "a", "b"]


@pytest.mark.parametrize("tool, args, text", [
    ("profile_batch", {}, "missing argument 'batch_id'"),
    ("profile_batch", {"batch_id": 3}, "argument 'batch_id' must be a string, not int"),
    ("load_batch", {"batch_id": ["B-0930-48-1"]}, "must be a string, not list"),
    ("load_batch", {"batch_id": None}, "must be a string, not NoneType"),
    ("run_sql", {"query": 1}, "argument 'query' must be a string"),
    ("run_sql", {"sql": "SELECT 1"}, "unexpected argument 'sql'"),
    ("quarantine_batch", {"batch_id": "B-0930-48-1", "column": "amount"}, "missing argument 'defect_type'"),
    ("submit_report", {"loaded": "B-0930-48-1", "quarantined": []}, "'loaded' must be a list of strings"),
    ("submit_report", {"loaded": [1], "quarantined": []}, "'loaded' must be a list of strings"),
    ("submit_report", {"loaded": []}, "missing argument 'quarantined'"),
    ("read_contract", {"x": 1}, "unexpected argument 'x'"),
    ("list_batches", ["not", "a", "dict"], "arguments must be an object"),
])
def test_malformed_arguments_are_refused_not_coerced(ep, tool, args, text):
    before = _snapshot(ep)
    r = ep.call(tool, args)
    assert set(r) == {"error"} and text in r["error"] and r["error"].startswith(tool)
    assert last(ep)["action"] == tool and last(ep)["executed"] is False and last(ep)["note"] == "bad arguments"
    assert _snapshot(ep) == before and chain_intact(ep.ledger.entries)


def test_unknown_tool_is_logged_and_refused(ep):
    r = ep.call("drop_everything", {"now": True})
    assert "unknown tool 'drop_everything'" in r["error"]
    assert last(ep)["note"] == "unknown tool" and not last(ep)["executed"]
    assert "unknown tool" in ep.call(["list"], {})["error"]


def test_a_refused_report_can_be_resubmitted(ep):
    ep.call("submit_report", {"loaded": "x", "quarantined": []})
    assert ep.world.report is None
    assert ep.call("submit_report", {"loaded": [], "quarantined": []}) == {"status": "received"}


@pytest.mark.parametrize("action, text, sent", [
    ("{not json", "action is not valid JSON", '"{not json"'),
    ({"tool": "load_batch", "args": {"batch_id": "B-1"}, "why": "x"}, "unexpected key 'why'", None),
    ({"args": {}}, "an action needs a 'tool'", '{"args": {}}'),
    (["load_batch", "[1]"], "arguments must be a JSON object, not list", "[1]"),
    (42, "an action is", "42"),
])
def test_a_malformed_action_is_refused_and_logged(ep, action, text, sent):
    before = _snapshot(ep)
    parsed = parse_action(action)
    assert parsed.problem
    r = ep.refuse(parsed)
    assert r == {"error": parsed.problem} and text in r["error"]
    e = last(ep)
    assert e["executed"] is False and e["note"] == "malformed action" and set(e["args"]) == {"sent"}
    assert e["action"] == (parsed.tool if isinstance(parsed.tool, str) else "?")
    if sent is not None:
        assert e["args"]["sent"] == sent
    assert _snapshot(ep) == before and chain_intact(ep.ledger.entries)


@pytest.mark.parametrize("action, want", [
    ({"type": "function", "id": "call_1", "function": {"name": "list_batches", "arguments": "{}"}}, ("list_batches", {})),
    ({"function": {"name": "run_sql", "arguments": '{"query": "SELECT 1"}'}}, ("run_sql", {"query": "SELECT 1"})),
    ({"name": "profile_batch", "arguments": {"batch_id": "B-1"}}, ("profile_batch", {"batch_id": "B-1"})),
    ({"name": "list_batches"}, ("list_batches", {})),
    ('{"type": "function", "function": {"name": "list_batches", "arguments": ""}}', ("list_batches", {})),
])
def test_a_chat_completions_tool_call_is_an_action(action, want):
    assert parse_action(action)[:2] == want and parse_action(action).problem is None


@pytest.mark.parametrize("action, text", [
    ({"type": "function", "function": "list_batches"}, "'function' must be an object"),
    ({"type": "code", "function": {"name": "list_batches"}}, "an action needs a 'tool'"),
    ({"function": {"name": "run_sql", "arguments": "{"}}, "arguments are not valid JSON"),
    ({"function": {"name": "run_sql", "arguments": "[1]"}}, "arguments must be a JSON object"),
    ({"name": "run_sql", "arguments": "{}", "extra": 1}, "an action needs a 'tool'"),
    ({"function": {"name": "x", "other": 1}}, "an action needs a 'tool'"),
])
def test_a_malformed_chat_completions_tool_call_is_refused(action, text):
    assert text in parse_action(action).problem
