"""Suite v2's tools and world: the three new tools and their refusals, the by-position loader, what a
read 'looked at', the scaled sandbox, and a classic episode that still offers exactly the seven."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gate_pipeline.kernel.cases import load_case, read_cases
from gate_pipeline.kernel.engine import Session, prepare
from gate_pipeline.kernel.ledger import chain_intact

ROOT = Path(__file__).resolve().parent.parent
V2_EVAL = ROOT / "cases" / "v2" / "eval_curated.jsonl"
CASES = {c.case_id: c for c in read_cases(V2_EVAL)}
SEVEN = ["read_contract", "list_batches", "profile_batch", "run_sql", "load_batch", "quarantine_batch",
         "submit_report"]
TEN = [*SEVEN[:-1], "quarantine_rows", "cite_defect", "ask_owner", "submit_report"]


def session(case_id: str) -> Session:
    return Session(prepare(CASES[case_id]))


def batch_of(case_id: str, table: str) -> dict:
    return next(b for b in CASES[case_id].data["batches"] if b["table"] == table)


def last(s: Session) -> dict:
    return s.episode.ledger.seal()[-1]


def test_an_episode_offers_the_tools_of_its_suite(eval_cases):
    v2 = session("v2-eval-partial-defect-0")
    assert list(v2.tools.tool_names) == TEN and v2.tools.suite.name == "v2"
    assert v2.call("drop_table", {}) == {"error": f"unknown tool 'drop_table'; tools are {TEN}"}
    classic = Session(prepare(eval_cases[0]))
    assert list(classic.tools.tool_names) == SEVEN and classic.tools.suite.name == "classic"
    for tool in ("quarantine_rows", "cite_defect", "ask_owner"):  # not a classic tool: the classic text
        assert classic.call(tool, {}) == {"error": f"unknown tool {tool!r}; tools are {SEVEN}"}
        assert last(classic)["note"] == "unknown tool"
    v2.finish(), classic.finish()


def test_quarantine_rows_holds_rows_back_from_the_load():
    s = session("v2-eval-partial-defect-0")
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    bad = sorted({k for d in orders["truth"]["defects"] for k in d["keys"]})
    out = s.call("quarantine_rows", {"batch_id": orders["batch_id"], "keys": [*bad, "O-none"], "column": "amount",
                                     "defect_type": "missing_value"})
    assert out == {"status": "held", "batch_id": orders["batch_id"], "rows_held": len(bad), "keys_not_found": 1,
                   "next": "load_batch loads the other rows; the report lists this batch under loaded"}
    assert last(s)["args"]["rows_matched"] == len(bad)
    loaded = s.call("load_batch", {"batch_id": orders["batch_id"]})
    assert loaded == {"status": "loaded", "rows_loaded": orders["row_count"] - len(bad), "errors": 0,
                      "rows_held_back": len(bad)}
    conn = s.episode.world.conn
    marks = ",".join("?" * len(bad))
    assert conn.execute(f"SELECT COUNT(*) FROM wh_orders WHERE order_id IN ({marks})", bad).fetchone() == (0,)
    assert conn.execute("SELECT COUNT(*) FROM wh_orders WHERE batch_id = ?", (orders["batch_id"],)).fetchone() \
        == (orders["row_count"] - len(bad),)
    s.finish()


@pytest.mark.parametrize("args, error, note", [
    ({"batch_id": "B-nope", "keys": ["x"], "column": "amount", "defect_type": "missing_value"}, "no batch", "unknown batch"),
    ({"keys": ["x"], "column": "amount", "defect_type": "too_big"}, "defect_type must be one of", "unknown defect type"),
    ({"keys": ["x"], "column": "email", "defect_type": "missing_value"}, "column must be one of", "unknown column"),
    ({"keys": [], "column": "amount", "defect_type": "missing_value"}, "keys must name at least one row", "no keys"),
    ({"keys": ["O-none"], "column": "amount", "defect_type": "missing_value"}, "none of these keys", "unknown keys"),
    ({"keys": "O1", "column": "amount", "defect_type": "missing_value"}, "must be a list of strings", "bad arguments"),
    ({"keys": ["x"] * 1001, "column": "amount", "defect_type": "missing_value"}, "at most 1000", "bad arguments"),
])
def test_quarantine_rows_refusals(args, error, note):
    s = session("v2-eval-partial-defect-0")
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    args = {"batch_id": orders["batch_id"], **args}
    out = s.call("quarantine_rows", args)
    assert error in out["error"] and last(s)["note"] == note and not last(s)["executed"]
    s.finish()


def test_rows_cannot_be_held_back_after_a_load_nor_from_a_quarantined_batch_nor_without_a_key_column():
    import copy
    s = session("v2-eval-partial-defect-0")
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    key = orders["truth"]["defects"][0]["keys"][0]
    s.call("load_batch", {"batch_id": orders["batch_id"]})
    out = s.call("quarantine_rows", {"batch_id": orders["batch_id"], "keys": [key], "column": "amount",
                                     "defect_type": "missing_value"})
    assert "already loaded" in out["error"] and last(s)["note"] == "already loaded"
    s.finish()
    s = session("v2-eval-volume-anomaly-0")
    orders = batch_of("v2-eval-volume-anomaly-0", "orders")
    s.call("quarantine_batch", {"batch_id": orders["batch_id"], "column": "order_id", "defect_type": "volume_anomaly"})
    out = s.call("quarantine_rows", {"batch_id": orders["batch_id"], "keys": ["x"], "column": "order_id",
                                     "defect_type": "duplicate_key"})
    assert out == {"error": f"{orders['batch_id']} is quarantined"}
    s.finish()
    case = copy.deepcopy(CASES["v2-eval-schema-drift-1"].data)  # a file whose header names no order_id
    orders = next(b for b in case["batches"] if b["table"] == "orders")
    orders["csv"] = "id" + orders["csv"][len("order_id"):]
    s = Session(prepare(load_case(case)))
    out = s.call("quarantine_rows", {"batch_id": orders["batch_id"], "keys": ["x"], "column": "amount",
                                     "defect_type": "wrong_type"})
    assert out == {"error": f"{orders['batch_id']}'s file has no column 'order_id' to name its rows by"}
    s.finish()


def test_the_warehouse_takes_a_batch_at_most_twice_so_an_agent_cannot_load_until_the_machine_has_no_room():
    """Loading one batch again and again would grow the episode's database until a write finds no room: the
    machine's failure (NoRoom), which ends the run without grading the agent. A second load is the duplicate the
    grade counts; a third is refused as a tool error, recorded as such, and the warehouse does not grow."""
    s = session("v2-eval-partial-defect-0")
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    bid = orders["batch_id"]

    def warehouse_rows():
        return s.episode.world.conn.execute("SELECT COUNT(*) FROM wh_orders").fetchone()[0]
    before = warehouse_rows()
    for _ in range(2):
        assert s.call("load_batch", {"batch_id": bid})["status"] == "loaded"
    assert warehouse_rows() == before + 2 * orders["row_count"]
    for _ in range(3):
        out = s.call("load_batch", {"batch_id": bid})
        assert out == {"error": f"{bid} is loaded 2 times tonight; the warehouse takes no more of it"}
        assert last(s)["note"] == "load limit" and not last(s)["executed"]
    assert warehouse_rows() == before + 2 * orders["row_count"] and s.episode.world.loads[bid] == 2
    s.call("quarantine_batch", {"batch_id": bid, "column": "amount", "defect_type": "missing_value"})
    assert s.call("load_batch", {"batch_id": bid}) == {"error": f"{bid} is quarantined"}  # the kernel's refusal first
    s.call("submit_report", {"loaded": [bid], "quarantined": []})
    twice = s.finish().grade
    assert twice.reward < 1.0


def test_a_stored_ledger_with_a_third_load_of_one_batch_does_not_replay_and_gate_verify_says_it_is_now_refused():
    """An episode stored under an earlier gate (a third load of one batch executed) does not replay now, and its
    problem names the refusal, so a reader can tell an earlier rule from an edited ledger."""
    from gate_pipeline.kernel.records import StoredEpisode
    from gate_pipeline.verify import rebuild
    case = CASES["v2-eval-partial-defect-0"]
    bid = batch_of("v2-eval-partial-defect-0", "orders")["batch_id"]
    s = session("v2-eval-partial-defect-0")
    for _ in range(2):
        s.call("load_batch", {"batch_id": bid})
    entries = [dict(e) for e in s.finish().ledger]
    entries.append(dict(entries[-1]))  # as the earlier rule executed it
    stored = StoredEpisode("e", case, "scripted", {}, "r", 0, "ended", "no_report", "", entries, "", None)
    problem = rebuild(stored, {"warehouse_sha256": ""})
    assert problem == ("its ledger does not replay: applied to the stored case, executed call 2 (load_batch) does not "
                       "give the entry stored (applied now, it is refused: load limit)")
    # an executed entry no tool makes, before it: the hint is of that entry's call (none was made), not of the load's
    unknown = {**entries[-1], "action": "frobnicate", "args": {}}
    stored = StoredEpisode("e", case, "scripted", {}, "r", 0, "ended", "no_report", "", [*entries[:-1], unknown,
                                                                                         entries[-1]], "", None)
    assert rebuild(stored, {"warehouse_sha256": ""}) == (
        "its ledger does not replay: applied to the stored case, executed call 2 (frobnicate) does not give the "
        "entry stored")


def test_cite_defect_needs_a_quarantine_and_cites_once():
    s = session("v2-eval-multi-defect-0")
    orders = batch_of("v2-eval-multi-defect-0", "orders")
    bid = orders["batch_id"]
    out = s.call("cite_defect", {"batch_id": bid, "column": "currency", "defect_type": "wrong_currency"})
    assert "is not quarantined" in out["error"] and last(s)["note"] == "not quarantined"
    s.call("quarantine_batch", {"batch_id": bid, "column": "amount", "defect_type": "missing_value"})
    assert s.call("cite_defect", {"batch_id": bid, "column": "currency", "defect_type": "wrong_currency"}) == \
        {"status": "cited", "batch_id": bid, "citations": 2}
    again = s.call("cite_defect", {"batch_id": bid, "column": "amount", "defect_type": "missing_value"})
    assert again == {"error": f"{bid}: amount / missing_value is already cited"}
    s.finish()


def test_ask_owner_answers_by_value_from_the_case_free_for_the_columns_the_contract_names():
    case_id = "v2-eval-ask-the-owner-0"
    s = session(case_id)
    cust = batch_of(case_id, "customers")

    def ask(column, value, question="accept?"):
        return s.call("ask_owner", {"batch_id": cust["batch_id"], "column": column, "value": value,
                                    "question": question})
    owner = CASES[case_id].data["owner"]
    for ruling in ("accept", "reject"):
        r = next(r for r in owner if r["column"] == "country" and r["ruling"] == ruling)
        assert ask("country", r["value"]) == {"batch_id": cust["batch_id"], "column": "country", "value": r["value"],
                                              **{k: r[k] for k in ("ruling", "defect_type", "answer") if k in r},
                                              "cost": 0.0}
    never_ruled = ask("country", "Atlantis")  # a value no ruling names: the contract stands, it is rejected ...
    assert (never_ruled["ruling"], never_ruled["defect_type"]) == ("reject", "invalid_value")
    germany = next(r for r in owner if r["value"] == "Germany")  # ... in the words a ruled value of its kind has
    assert never_ruled["answer"] == germany["answer"].replace("Germany", "Atlantis")
    assert ask("country", "QQ")["answer"] == "QQ is not a market we sell in: reject these rows as country / invalid_value."
    listed = CASES[case_id].contract["limits"]["allowed_countries"][0]
    assert ask("country", listed)["ruling"] == "none"  # the contract settles a listed value
    paid = ask("email", "x")
    assert paid["cost"] == 0.02 and paid["ruling"] == "none" and "the contract stands" in paid["answer"]
    assert "column must be one of" in ask("colour", "x")["error"]
    assert "the limit is 1,000" in ask("email", "x", "?" * 1001)["error"]
    s.call("submit_report", {"loaded": [], "quarantined": []})
    grade = s.finish().grade
    assert grade.metrics["question_cost"] == 0.02  # the one question about a column the contract does not name


def test_the_loader_copies_by_position_whatever_the_header_says():
    case_id = "v2-eval-schema-drift-0"  # the export swapped order_id and customer_id
    s = session(case_id)
    orders = batch_of(case_id, "orders")
    assert orders["csv"].startswith("customer_id,order_id,")
    first_customer = orders["csv"].split("\n")[1].split(",")[0]
    s.call("load_batch", {"batch_id": orders["batch_id"]})
    conn = s.episode.world.conn
    ids = [r[0] for r in conn.execute("SELECT order_id FROM wh_orders WHERE batch_id = ? ORDER BY rowid",
                                      (orders["batch_id"],))]
    assert ids[0] == first_customer  # the customer id landed in order_id
    s.finish()


@pytest.mark.parametrize("template, looked", [
    ("SELECT COUNT(*) FROM {t} WHERE 0", False),
    ("SELECT * FROM {t} LIMIT 0", False),
    ("SELECT 1 FROM {t} WHERE rowid < 0", False),
    ("SELECT 1 WHERE EXISTS (SELECT 1 FROM {t} WHERE 0)", False),
    ("SELECT COUNT(*) FROM wh_orders w JOIN {t} s ON 0", False),
    ("SELECT name FROM sqlite_master WHERE name = '{t}'", False),
    ("SELECT COUNT(*) FROM {t}", True),
    ("SELECT * FROM {t} LIMIT 1", True),
    ("SELECT COUNT(*) FROM {t} WHERE amount = 'no such amount'", True),  # scanned every row, found none
    ("SELECT order_id FROM main.{t} WHERE trim(amount) = ''", True),
])
def test_a_read_looked_at_a_batch_when_its_rows_made_a_difference(template, looked):
    s = session("v2-eval-partial-defect-0")
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    table = s.prepared.staging[orders["batch_id"]]
    result = s.call("run_sql", {"query": template.format(t=table)})
    assert "error" not in result
    entry = last(s)
    assert (entry["args"]["looked_at"] == [table]) is looked
    assert not looked or table in entry["args"]["tables_read"] or "sqlite_master" in entry["args"]["tables_read"]
    # the test left the database as it was: the staging table is whole and the next read sees it
    assert s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {table}"})["rows"] == [[orders["row_count"]]]
    s.finish()


def test_v2_refuses_random_and_gates_own_functions():
    s = session("v2-eval-partial-defect-0")
    for query in ("SELECT random()", "SELECT gate_amount('1')", "SELECT printf('%d', 1)"):
        assert "not authorized" in s.call("run_sql", {"query": query})["error"]
    s.finish()


def test_an_episode_borrows_the_prepared_database_and_gives_it_back_untouched():
    prepared = prepare(CASES["v2-eval-late-dimension-0"])
    first = Session(prepared)
    second = Session(prepared)  # opened while the first holds it: a database of its own
    assert first.episode.world._borrowed and not second.episode.world._borrowed
    for bid in prepared.order:
        first.call("load_batch", {"batch_id": bid})
    first.finish(), second.finish()
    third = Session(prepared)
    assert third.episode.world._borrowed
    count = third.episode.world.conn.execute("SELECT COUNT(*) FROM wh_orders WHERE batch_id IN (?, ?)",
                                             prepared.order).fetchone()
    assert count == (0,)  # the first episode's loads were rolled back
    third.finish()


def test_the_profile_is_sqlites_and_counts_as_looking():
    s = session("v2-eval-partial-defect-0")
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    p = s.call("profile_batch", {"batch_id": orders["batch_id"]})
    assert p["rows"] == orders["row_count"] and list(p["columns"]) == [
        "order_id", "customer_id", "amount", "currency", "status", "order_date", "note"]
    blanks = next(d for d in orders["truth"]["defects"] if d["type"] == "missing_value")["keys"]
    assert p["columns"]["amount"]["n_blank"] == len(blanks)  # "", "   " or a tab
    assert p["columns"]["order_id"]["n_distinct"] == orders["row_count"]
    s.call("load_batch", {"batch_id": orders["batch_id"]})
    s.call("submit_report", {"loaded": [orders["batch_id"]], "quarantined": []})
    assert s.finish().grade.inspected == 1.0


def test_ledger_entries_of_the_new_tools_chain_and_grade_from_a_replay():
    from gate_pipeline.kernel.engine import replay
    case = CASES["v2-eval-multi-defect-0"]  # orders: blank amounts and foreign currencies, the whole batch;
    # customers: a customer the warehouse holds already, held back by rows
    orders = next(b for b in case.data["batches"] if b["table"] == "orders")
    cust = next(b for b in case.data["batches"] if b["table"] == "customers")
    assert orders["truth"]["disposition"] == "quarantine" and len(orders["truth"]["defects"]) == 2
    calls = [["profile_batch", {"batch_id": b["batch_id"]}] for b in case.data["batches"]]
    first, *rest = orders["truth"]["defects"]
    calls += [["quarantine_batch", {"batch_id": orders["batch_id"], "column": first["column"],
                                    "defect_type": first["type"]}]]
    calls += [["cite_defect", {"batch_id": orders["batch_id"], "column": d["column"], "defect_type": d["type"]}]
              for d in rest]
    calls += [["quarantine_rows", {"batch_id": cust["batch_id"], "keys": d["keys"], "column": d["column"],
                                   "defect_type": d["type"]}] for d in cust["truth"]["defects"]]  # held by rows
    calls += [["load_batch", {"batch_id": cust["batch_id"]}],
              ["submit_report", {"loaded": [cust["batch_id"]], "quarantined": [orders["batch_id"]]}]]
    results, episode = replay(prepare(case), calls)
    assert all("error" not in r for r in results)
    assert chain_intact(episode.ledger) and episode.grade.reward == 1.0
    assert json.loads(json.dumps(episode.ledger)) == episode.ledger


@pytest.mark.parametrize("query", ["VACUUM", "vacuum;", "  VaCuUm main", "/* tidy */ -- up\n VACUUM",
                                   "VACUUM INTO 'copy.db'", "\tvacuum/*x*/", ";VACUUM", "/**/;VACUUM", "; vacuum",
                                   ";;\n;VACUUM"])
def test_vacuum_is_refused_the_same_way_on_a_borrowed_database_and_on_its_own(query, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # VACUUM INTO would write a file: none is written
    prepared = prepare(CASES["v2-eval-partial-defect-0"])
    borrowed, own = Session(prepared), Session(prepared)
    assert borrowed.episode.world._borrowed and not own.episode.world._borrowed
    answers = [s.call("run_sql", {"query": query}) for s in (borrowed, own)]
    assert answers == [{"error": "not authorized"}] * 2
    entries = [last(s) for s in (borrowed, own)]
    assert entries[0] == entries[1] and (entries[0]["executed"], entries[0]["note"]) == (False, "DatabaseError")
    assert not list(tmp_path.iterdir())
    for s in (borrowed, own):  # a word that only starts like it, or VACUUM later in the text, is SQLite's to answer
        assert s.call("run_sql", {"query": "SELECT 1 AS vacuum"}) == {"columns": ["vacuum"], "rows": [[1]],
                                                                        "truncated": False}
        assert "syntax error" in s.call("run_sql", {"query": "vacuumed"})["error"]
        s.finish()


def test_the_correct_mart_is_computed_before_the_first_load_and_is_the_same_after():
    case = CASES["v2-eval-late-dimension-0"]
    prepared = prepare(case)
    first = Session(prepared)
    first.call("run_sql", {"query": "SELECT COUNT(*) FROM wh_orders"})
    assert prepared._correct_mart is None
    count = "SELECT COUNT(*) FROM wh_customers"
    before = first.episode.world.conn.execute(count).fetchone()
    first.call("load_batch", {"batch_id": prepared.order[0]})  # its query's temporary tables never come on top of
    assert prepared._correct_mart is not None  # a load and its rollback journal
    for bid in prepared.order[1:]:
        first.call("load_batch", {"batch_id": bid})
    assert first.episode.world.conn.execute(count).fetchone() != before
    late = prepare(case)  # an episode that loads nothing: computed when it is graded
    assert late.order and late._correct_mart is None
    quiet = Session(late)
    quiet.call("submit_report", {"loaded": [], "quarantined": []})
    assert late._correct_mart is None
    assert quiet.finish().grade.correct_revenue == first.finish().grade.correct_revenue == prepared.correct_mart


def test_the_ledger_keeps_the_keys_a_call_named_whatever_the_caller_does_with_its_list_later():
    """A list passed to a tool is copied before the ledger keeps it: the caller changing its list after the
    call (before or after the episode ends and its chain is hashed) changes nothing stored or graded."""
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    bad = sorted({k for d in orders["truth"]["defects"] for k in d["keys"]})
    kept = []
    for when in ("before", "after"):
        s = session("v2-eval-partial-defect-0")
        keys = list(bad)
        s.call("quarantine_rows", {"batch_id": orders["batch_id"], "keys": keys, "column": "amount",
                                   "defect_type": "missing_value"})
        if when == "before":
            keys[:] = ["O-other"]
        result = s.finish()
        keys[:] = ["O-something-else"]
        entry = result.ledger[0]
        assert entry["args"]["keys"] == bad and chain_intact(result.ledger)
        kept.append(entry["hash"])
    assert kept[0] == kept[1]


def test_every_character_sqlite_skips_before_vacuum_the_refusal_skips_too():
    """SQLite itself says which characters it reads past before a VACUUM (inside a transaction it answers
    "cannot VACUUM from within a transaction"): before the keyword, after it, inside a comment before it. For
    every character of the Basic Multilingual Plane and a sample of the others, what SQLite would run as VACUUM
    the refusal matches (it may refuse more: text SQLite would refuse anyway)."""
    import sqlite3

    from gate_pipeline.suites.v2.sandbox import _VACUUM
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (1)")
    missed, skipped = [], 0
    for cp in [*range(1, 0xD800), *range(0xE000, 0x10000), *range(0x10000, 0x110000, 251)]:
        for query in (chr(cp) + "VACUUM", "VACUUM" + chr(cp), "/*" + chr(cp) + "*/VACUUM"):
            try:
                conn.execute(query)
                continue
            except (sqlite3.Error, ValueError) as exc:
                if "cannot VACUUM" not in str(exc):
                    continue
            skipped += 1
            if not _VACUUM.match(query):
                missed.append(hex(cp))
    assert skipped > 60_000 and missed == []  # the comment case alone is one a character


SIDE_BY_SIDE_CHILD = """
import json, threading, time
from gate_pipeline.kernel.cases import load_case
from gate_pipeline.kernel.contract import load_contract
from gate_pipeline.kernel.engine import Session, prepare
from gate_pipeline.suites.v2.generator import generate_case

case = load_case(generate_case("v2-side-by-side", "partial-defect", 0, 11, load_contract("v2"), 8000))
prepared = prepare(case)
a, b = Session(prepared), Session(prepared)
query = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 300000) SELECT COUNT(*) FROM r"
reading = threading.Event()

def reads():
    for _ in range(10):
        a.call("run_sql", {"query": query})
        reading.set()

t = threading.Thread(target=reads)
t.start()
reading.wait()
profiles = [b.call("profile_batch", {"batch_id": bid}) for bid in prepared.order]
copy = prepared.profile_of(prepared.order[0])  # no episode's connection: a copy of the lent database
b.call("submit_report", {"loaded": [], "quarantined": list(prepared.order)})
graded = b.finish().grade.correct_revenue
t.join()
alone = prepare(case)
print(json.dumps({"borrowed": [a.episode.world._borrowed, b.episode.world._borrowed],
                  "same": profiles == [alone.profile(bid) for bid in alone.order] and copy == profiles[0],
                  "mart": [graded, alone.correct_mart]}))
"""


def test_two_episodes_of_one_case_side_by_side_never_share_a_connection():
    """`gate serve` and trainers play one case in several threads: one episode borrows the prepared database, the
    others play on databases of their own. A first profile or correct mart asked for by the second while the first
    runs a query must not be read through the first's connection (SQLite's callbacks on one thread and a second
    thread on the same connection deadlock both, and the whole process with them): each episode reads through its
    own. In a child process, so that a deadlock fails the test rather than hanging it."""
    import subprocess
    import sys
    child = subprocess.run([sys.executable, "-c", SIDE_BY_SIDE_CHILD], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    got = json.loads(child.stdout.splitlines()[-1])
    assert got["borrowed"] == [True, False] and got["same"] and got["mart"][0] == got["mart"][1], got


def test_a_dense_episode_reads_its_gold_rows_before_it_borrows_the_cases_database():
    """The dense reward's gold rows are read from the case's database: read after the episode borrowed it, each read
    built a copy of the whole database (seconds at real size, and its room again on disk). Made first, the episode
    then borrows the database, and nothing is built."""
    prepared = prepare(CASES["v2-eval-partial-defect-0"])
    built = []
    build = prepared.build
    prepared.build = lambda: built.append(1) or build()  # type: ignore[method-assign]
    s = Session(prepared, reward="dense")
    assert s.episode.world._borrowed and built == [] and prepared.gold_rows
    s.finish()


def test_a_no_room_error_of_gates_own_statement_around_a_read_is_the_machines_and_compiles_no_agent_text():
    """Only the agent's query itself, authorised and run under the guard, is ever compiled again to see whether it
    makes temporary files of its own; a no-room error from gate's own statements around it (reading the schema) is
    the machine's at once, and text the guard never let compile (a pragma, here in a comment's company) is not
    compiled unguarded, where SQLite would carry the pragma out."""
    import sqlite3

    from gate_pipeline.kernel.errors import NoRoom
    s = session("v2-eval-partial-defect-0")
    sandbox = s.episode.world.sandbox
    conn = s.episode.world.conn
    before = conn.execute("PRAGMA hard_heap_limit").fetchone()[0]
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = sqlite3.SQLITE_FULL
    sandbox.query_error = None
    with pytest.raises(NoRoom):
        sandbox._machines(exc, "/* stg */ PRAGMA hard_heap_limit = 2000000")
    assert conn.execute("PRAGMA hard_heap_limit").fetchone()[0] == before
    s.finish()


def test_a_read_held_for_its_turn_looked_at_its_batch_as_it_does_alone():
    """On a thread with a pacer (gate serve's), a read is timed by its thread's CPU time, but the look check still
    measured what was left of its budget by the clock: a read held 2.3 s for its turn answered, and then had no
    budget left to decide whether it looked, so its `looked_at` was empty where alone it names the batch."""
    from test_sandbox import HoldingPacer

    from gate_pipeline.kernel import sandbox
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    for hold in (None, 2.3):  # alone; held past its 2 s of the clock at its first progress check
        s = session("v2-eval-partial-defect-0")  # (a batch is looked at once: a session each)
        table = s.prepared.staging[orders["batch_id"]]
        pacer = HoldingPacer(hold) if hold else None
        sandbox.pace(pacer)
        try:
            result = s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {table} WHERE amount = 'no such amount'"})
        finally:
            sandbox.pace(None)
        assert result["rows"] == [[0]] and last(s)["args"]["looked_at"] == [table], (hold, result, last(s))
        assert pacer is None or pacer.deadlines, "the read was never held: it proves nothing"
        s.finish()


class _HeldOncePerRun:
    """A pacer holding each run (`fresh`: set as it starts) at its first progress check for `hold` seconds, or to the
    deadline it is told, as `gate serve`'s baton holds each run behind other clients' long queries."""

    def __init__(self, hold: float):
        self.hold, self.held, self.released, self.fresh = hold, 0, 0, False

    def wait(self, deadline):
        if not self.fresh:
            return 0.0
        self.fresh, start = False, time.monotonic()
        time.sleep(max(0.0, min(deadline, start + self.hold) - start))
        self.held += 1
        return time.monotonic() - start

    def done(self):
        self.released += 1


def test_the_look_checks_runs_wait_for_their_turns_apart_from_the_reads(monkeypatch):
    """Each run of the look check waits for its turn again, behind other clients' queries. It shared the read's cap
    on waiting, so on a loaded server the read's own waits used it up, the check's run was stopped at it, and the
    read had looked at nothing (12 clients' long queries: `inspected` 0.5 where alone it is 1.0). The check now
    takes what is left of the read's budget (its CPU time) and a wait of its own, and gives the turn up after."""
    from gate_pipeline.kernel import sandbox
    monkeypatch.setattr(sandbox, "MAX_WAIT_S", 1.0)  # a wait of at most the budget and 1 s, each run held 1.6 s
    orders = batch_of("v2-eval-partial-defect-0", "orders")
    s = session("v2-eval-partial-defect-0")
    table = s.prepared.staging[orders["batch_id"]]
    assert s.episode.world.sandbox.time_budget < 2.5  # the read's run, held 1.6 s, leaves under 1 s of its cap
    pacer = _HeldOncePerRun(1.6)
    box = s.episode.world.sandbox
    run = box.execute

    def each_run_waits(*args, **kwargs):
        pacer.fresh = True
        return run(*args, **kwargs)
    monkeypatch.setattr(box, "execute", each_run_waits)
    sandbox.pace(pacer)
    try:
        result = s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {table} WHERE amount = 'no such amount'"})
    finally:
        sandbox.pace(None)
    assert result["rows"] == [[0]] and pacer.held >= 2, (result, pacer.held)  # the read and the check's run held
    assert last(s)["args"]["looked_at"] == [table], last(s)
    assert pacer.released == 1  # the turn kept from the read to the check's runs, and given up at the end
    s.finish()


def test_the_look_checks_runs_hand_the_baton_on_as_any_query_does():
    """A read that names a batch and does nothing, whose run with the batch emptied computes to the end of its
    budget: the look check's runs kept the read's turn without waiting (2 s), and another client's 10 ms query
    waited 1.3 s for it. They wait for their turns as any query does: the other client's is served in a turn."""
    import threading

    from gate_pipeline.integrations.openenv_lanes import Baton, _Pacer
    from gate_pipeline.kernel import sandbox
    baton = Baton(0.02)
    heavy = ("(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c WHERE "
             f"instr(upper(lower(upper(substr('{'ab' * 4000}', x % 3)))), 'zz') > x)")  # string work: much CPU a step
    seconds: dict[str, float] = {}
    started = threading.Event()

    def client(name, query_of, case_id):
        pacer = _Pacer(baton, None)
        pacer.turn.owner = name
        sandbox.pace(pacer)
        try:
            s = session(case_id)
            query = query_of(s)
            if name == "other":
                started.wait(30)
                time.sleep(0.3)  # while the look check's run computes
            else:
                started.set()
            start = time.monotonic()
            answer = s.call("run_sql", {"query": query})
            seconds[name] = time.monotonic() - start
            assert "rows" in answer, answer
            s.finish()
        finally:
            sandbox.pace(None)

    def reader(s):
        table = s.prepared.staging[batch_of("v2-eval-partial-defect-0", "orders")["batch_id"]]
        return f"SELECT (SELECT count(*) FROM {table}), CASE WHEN NOT EXISTS (SELECT 1 FROM {table}) THEN {heavy} END"

    threads = [threading.Thread(target=client, args=("reader", reader, "v2-eval-partial-defect-0")),
               threading.Thread(target=client, args=("other", lambda s: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
                                                     "SELECT x + 1 FROM c LIMIT 20000) SELECT count(*) FROM c",
                                                     "v2-eval-partial-defect-0"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seconds["reader"] > 1.0, seconds  # its check's run computed to the end of its budget
    assert seconds["other"] < 0.6, seconds  # served in a turn or a few, not after the check's run


def test_a_read_counted_finely_asks_its_pacer_every_interval_not_every_count():
    """A read that may look at a batch counts its steps every few steps (the look check compares them), and asked
    its pacer and the thread's CPU clock at each count: on `gate serve`'s threads the same read took twice the
    CPU it takes in process (1.2 s against 0.6 s), and near its budget its look check decided otherwise. The
    pacer and the clock are asked every INTERVAL steps, as for any read."""
    from gate_pipeline.kernel import sandbox

    class Counting:
        waits = 0

        def wait(self, deadline):
            Counting.waits += 1
            return 0.0

        def done(self):
            pass

    s = session("v2-eval-partial-defect-0")
    table = s.prepared.staging[batch_of("v2-eval-partial-defect-0", "orders")["batch_id"]]
    box = s.episode.world.sandbox
    assert box.fine < sandbox.INTERVAL // 10  # counted finely
    sandbox.pace(Counting())
    try:
        result = s.call("run_sql", {"query": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE "
                                              f"x < 20000) SELECT count(*), (SELECT count(*) FROM {table}) FROM c"})
    finally:
        sandbox.pace(None)
    assert "rows" in result and last(s)["args"]["looked_at"] == [table], (result, last(s))
    counts = box.steps // box.fine  # the last run's progress checks (the look check's run with the batch emptied)
    assert counts > 1000 and Counting.waits < 3 * box.steps // sandbox.INTERVAL + 6, (counts, Counting.waits)
    s.finish()
