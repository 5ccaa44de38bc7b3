"""A look is a read of the batch's rows: `inspected` in suite v2 comes from what SQLite read, never from
anything a query can see change without reading them (the schema, pragmas, the clock, randomness,
change counters, SQLite's page views, other tables), and the check fits within the query's budget
whatever the query names, on a 20-row case and on a 200,000-row one."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gate_pipeline.kernel.agents import AgentSpec
from gate_pipeline.kernel.cases import load_case, read_cases
from gate_pipeline.kernel.engine import Session, play, prepare
from gate_pipeline.suites.v2.agents import Oracle

ROOT = Path(__file__).resolve().parent.parent
CASES = {c.case_id: c for c in read_cases(ROOT / "cases" / "v2" / "eval_curated.jsonl")}
CASE = "v2-eval-partial-defect-0"

# queries that name a batch's staging table {t} (and the other batch's, {u}) without reading its rows
NOT_LOOKS = {
    "WHERE 0": "SELECT COUNT(*) FROM {t} WHERE 0",
    "LIMIT 0": "SELECT * FROM {t} LIMIT 0",
    "rowid < 0": "SELECT 1 FROM {t} WHERE rowid < 0",
    "an empty join": "SELECT COUNT(*) FROM wh_orders w JOIN {t} s ON 0",
    "sqlite_master": "SELECT name, rootpage, sql FROM sqlite_master WHERE name = '{t}' OR (SELECT 1 FROM {t} WHERE 0)",
    "sqlite_master's size": "SELECT COUNT(*), SUM(rootpage), (SELECT COUNT(*) FROM {t} WHERE 0) FROM sqlite_master",
    "the clock": "SELECT julianday('now'), strftime('%f', 'now'), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "the clock, keywords": "SELECT CURRENT_TIMESTAMP, date(), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "the clock in a WHERE": "SELECT COUNT(*) FROM {t} WHERE julianday('now') < 0",
    "another table": "SELECT COUNT(*), (SELECT COUNT(*) FROM {t} WHERE 0) FROM wh_orders",
    "the other batch": "SELECT COUNT(*) FROM {u} WHERE (SELECT COUNT(*) FROM {t} WHERE 0) = 0",
    "the load log": "SELECT SUM(rows) FROM wh_load_log WHERE (SELECT COUNT(*) FROM {t} LIMIT 0) IS NULL",
    "a CTE": "WITH e AS (SELECT * FROM {t} WHERE 0) SELECT COUNT(*) FROM e",
    "a recursive CTE": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 500) "
                       "SELECT COUNT(*), (SELECT COUNT(*) FROM {t} WHERE 0) FROM r",
}
# queries SQLite refuses in a v2 episode (what could change without the rows changing)
REFUSED = {
    "random()": "SELECT random(), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "randomblob()": "SELECT randomblob(4), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "total_changes()": "SELECT total_changes(), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "changes()": "SELECT changes(), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "last_insert_rowid()": "SELECT last_insert_rowid(), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "pragma_page_count": "SELECT * FROM pragma_page_count(), (SELECT COUNT(*) FROM {t} WHERE 0)",
    "pragma_table_info": "SELECT * FROM pragma_table_info('{t}')",
    "pragma_freelist_count": "SELECT * FROM pragma_freelist_count()",
    "dbstat": "SELECT SUM(ncell) FROM dbstat WHERE name = '{t}'",
    "sqlite_temp_master": "SELECT COUNT(*) FROM sqlite_temp_master",
}
LOOKS = {
    "COUNT(*)": "SELECT COUNT(*) FROM {t}",
    "one row": "SELECT * FROM {t} LIMIT 1",
    "a scan that finds nothing": "SELECT COUNT(*) FROM {t} WHERE amount = 'no such amount'",
    "a value": "SELECT order_id FROM main.{t} WHERE trim(amount) = ''",
    "against the warehouse": "SELECT COUNT(*) FROM {t} s JOIN wh_orders w ON w.order_id = s.order_id",
    "with the clock": "SELECT COUNT(*) FROM {t} WHERE order_date < date('now')",
}


def tables(s: Session):
    orders = next(b for b in CASES[CASE].batches if b.table == "orders")
    customers = next(b for b in CASES[CASE].batches if b.table == "customers")
    return s.prepared.staging[orders.batch_id], s.prepared.staging[customers.batch_id]


def read(s: Session, template: str):
    t, u = tables(s)
    result = s.call("run_sql", {"query": template.format(t=t, u=u)})
    return result, s.episode.ledger.seal()[-1]


@pytest.mark.parametrize("name", NOT_LOOKS)
def test_a_query_that_reads_no_row_of_the_batch_is_not_a_look(name):
    s = Session(prepare(CASES[CASE]))
    t, u = tables(s)
    for _ in range(3):  # the same answer every time: nothing the check compares can change by itself
        result, entry = read(s, NOT_LOOKS[name])
        assert "error" not in result, result
        assert t not in entry["args"]["looked_at"], (name, entry["args"])
    assert t in s.episode.world.sandbox.pending
    s.finish()


@pytest.mark.parametrize("name", REFUSED)
def test_what_could_change_without_the_rows_changing_is_refused(name):
    s = Session(prepare(CASES[CASE]))
    result, entry = read(s, REFUSED[name])
    assert "error" in result and not entry["executed"], (name, result)
    s.finish()


@pytest.mark.parametrize("name", LOOKS)
def test_a_query_that_reads_the_batchs_rows_is_a_look(name):
    s = Session(prepare(CASES[CASE]))
    t, _ = tables(s)
    result, entry = read(s, LOOKS[name])
    assert "error" not in result and entry["args"]["looked_at"] == [t], (name, entry["args"])
    # the check left everything as it was: the staging table is whole, the next read sees it
    rows = s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {t}"})["rows"]
    assert rows == [[s.prepared.row_counts[next(b for b, n in s.prepared.staging.items() if n == t)]]]
    s.finish()


def test_the_clock_is_the_nights_load_time_on_every_run():
    s = Session(prepare(CASES[CASE]))
    night = CASES[CASE].data["night"]
    first = s.call("run_sql", {"query": "SELECT date('now'), datetime(), CURRENT_DATE, julianday('now'), "
                                        "strftime('%Y-%m-%d %H:%M:%f', 'now'), date('now', '+1 day'), "
                                        "date('2026-10-01', '+7 days')"})["rows"]
    time.sleep(0.01)
    assert s.call("run_sql", {"query": "SELECT date('now'), datetime(), CURRENT_DATE, julianday('now'), "
                                       "strftime('%Y-%m-%d %H:%M:%f', 'now'), date('now', '+1 day'), "
                                       "date('2026-10-01', '+7 days')"})["rows"] == first
    assert first[0][0] == night and first[0][2] == night and first[0][1] == f"{night} 02:00:00"
    assert first[0][6] == "2026-10-08"  # every other date works as in SQLite
    seen = []  # on another thread (a server's), with that thread's own connection for the clock
    thread = threading.Thread(target=lambda: seen.append(s.call("run_sql", {"query": "SELECT date('now'), datetime(), "
                              "CURRENT_DATE, julianday('now'), strftime('%Y-%m-%d %H:%M:%f', 'now'), date('now', "
                              "'+1 day'), date('2026-10-01', '+7 days')"})["rows"]))
    thread.start()
    thread.join()
    assert seen == [first]
    s.finish()


class LooksBy(Oracle):
    """An oracle (the labels' decisions) whose only look at each batch is one query."""
    name = "looks-by"

    def __init__(self, template: str):
        self.template = template

    def inspect(self, tools, batch):
        others = [b for b in tools("list_batches") if b["batch_id"] != batch["batch_id"]]
        tools("run_sql", query=self.template.format(t=batch["staging_table"], u=others[0]["staging_table"]))


@pytest.mark.parametrize("name", [n for n in NOT_LOOKS if n != "the other batch"])  # that one reads the other's rows
def test_an_oracle_whose_looks_read_no_row_earns_no_inspected_credit(name):
    for case in list(CASES.values())[::8]:
        template = NOT_LOOKS[name].replace("amount", "1")
        result = play(prepare(case), AgentSpec("looks-by", {"template": template}, LooksBy))
        assert result.grade.inspected == 0.0 and result.grade.reward == pytest.approx(0.85), (name, case.case_id)


def test_after_gates_own_writes_changed_the_schema_a_read_of_no_row_is_still_no_look():
    """Rows held back and their batch loaded (gate's temporary table of held keys, made inside the episode's
    transaction: each look check's rollback then makes SQLite read the schema again) change nothing a look
    compares: a read of no row is no look for either batch it names, run after run, and a read of the rows is."""
    s = Session(prepare(CASES[CASE]))
    t, u = tables(s)
    customers = next(b for b in CASES[CASE].batches if b.table == "customers")
    key = s.call("run_sql", {"query": f"SELECT customer_id FROM {u} LIMIT 1"})["rows"][0][0]
    assert u in s.episode.ledger.seal()[-1]["args"]["looked_at"]
    sandbox = s.episode.world.sandbox
    sandbox.pending.add(u)  # undecided again, so that each read below checks both batches
    s.call("quarantine_rows", {"batch_id": customers.batch_id, "keys": [key], "column": "customer_id",
                               "defect_type": "duplicate_key"})
    assert s.call("load_batch", {"batch_id": customers.batch_id})["rows_held_back"] == 1
    for _ in range(2):
        for name, template in NOT_LOOKS.items():
            if name == "the other batch":  # that one reads the other's rows
                continue
            result, entry = read(s, template.replace("{t}", "{t}, {u}", 1) if name == "WHERE 0" else template)
            assert "error" not in result and entry["args"]["looked_at"] == [], (name, entry["args"])
    assert sandbox.pending == {t, u}
    result, entry = read(s, "SELECT COUNT(*) FROM {t}, {u}")
    assert entry["args"]["looked_at"] == sorted([t, u])
    s.finish()


def test_a_batch_once_looked_at_is_never_checked_again():
    s = Session(prepare(CASES[CASE]))
    sandbox = s.episode.world.sandbox
    t, u = tables(s)
    calls = []
    original = sandbox._rerun_empty

    def counted(query, table, *budget):
        calls.append(table)
        return original(query, table, *budget)
    sandbox._rerun_empty = counted
    s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {t} WHERE 0"})
    assert calls == [t]  # not yet decided: checked
    s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {t}"})
    assert calls == [t, t] and t not in sandbox.pending
    for _ in range(3):
        s.call("run_sql", {"query": f"SELECT COUNT(*) FROM {t}, {u} WHERE 0"})
    assert calls == [t, t, u, u, u]  # the looked-at batch is never checked again
    s.finish()


def test_a_read_whose_text_names_no_undecided_batch_decides_nothing_and_is_counted_as_any_read():
    s = Session(prepare(CASES[CASE]))
    sandbox = s.episode.world.sandbox
    t, u = tables(s)
    assert sandbox.may_look(f"SELECT COUNT(*) FROM {t.upper()}")  # SQLite's names ignore ASCII case
    result, entry = read(s, "SELECT COUNT(*) FROM {T}".replace("{T}", t.upper()))
    assert entry["args"]["looked_at"] == [t] and sandbox.counted
    for query in (f"SELECT COUNT(*) FROM {t}", "SELECT COUNT(*) FROM wh_orders"):
        assert not sandbox.may_look(query)
        result, entry = read(s, query)
        assert "error" not in result and entry["args"]["looked_at"] == [] and not sandbox.counted
    result, entry = read(s, f"SELECT COUNT(*) FROM {t}, {u}")
    assert entry["args"]["looked_at"] == [u] and sandbox.counted and not sandbox.pending
    assert not sandbox.may_look(f"SELECT COUNT(*) FROM {t}, {u}")  # every batch decided: no read is counted finely
    s.finish()


@pytest.mark.parametrize("name", ["COUNT(*)", "a scan that finds nothing", "WHERE 0", "rowid < 0", "the clock"])
def test_a_read_of_an_undecided_batch_counted_as_any_read_is_decided_all_the_same(name):
    """`may_look` never says no to a read of an undecided batch; if it did, the read is counted again."""
    s = Session(prepare(CASES[CASE]))
    sandbox = s.episode.world.sandbox
    sandbox.may_look = lambda query: False
    t, _ = tables(s)
    result, entry = read(s, {**LOOKS, **NOT_LOOKS}[name])
    assert "error" not in result and entry["args"]["looked_at"] == ([t] if name in LOOKS else []), entry["args"]
    s.finish()


def test_run_sql_returns_within_its_budget_when_a_read_is_counted_again():
    assert_within_budget(CASES[CASE], may_look=False)


# -- the check fits within the query's budget, whatever the query names ------------------------------------

def heavy(t: str, u: str, n: int) -> str:
    """A query that names both staging tables, reads neither, and works n recursion steps."""
    return (f"WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < {n}) "
            f"SELECT COUNT(*), (SELECT COUNT(*) FROM {t} WHERE 0), (SELECT COUNT(*) FROM {u} WHERE 0) FROM r")


def steps_per_iteration(s: Session, t: str, u: str) -> float:
    sandbox = s.episode.world.sandbox
    sandbox.execute(heavy(t, u, 20_000))
    return sandbox.steps / 20_000


def assert_within_budget(case, slack: float = 0.5, may_look: bool = True) -> None:
    s = Session(prepare(case))
    sandbox = s.episode.world.sandbox
    if not may_look:  # every read counted as any read first, then again to decide its looks
        sandbox.may_look = lambda query: False
    by = {b.table: s.prepared.staging[b.batch_id] for b in case.batches}
    t, u = by["orders"], by["customers"]
    per = steps_per_iteration(s, t, u)
    for share in (0.3, 0.55, 0.9, 1.5):  # of the step budget: the check must fit in what is left
        n = int(sandbox.step_budget * share / per)
        start = time.monotonic()
        result = s.call("run_sql", {"query": heavy(t, u, n)})
        took = time.monotonic() - start
        assert took <= sandbox.time_budget + slack, (share, took, sandbox.time_budget)
        entry = s.episode.ledger.seal()[-1]
        assert "error" in result or entry["args"]["looked_at"] == [], (share, entry["args"])
    assert {t, u} <= sandbox.pending
    s.finish()


def test_a_query_that_takes_long_to_compile_returns_within_the_budget_and_is_no_look():
    from test_sandbox import one_select, repeated_columns, self_joined_ctes
    case = CASES[CASE]
    s = Session(prepare(case))
    sandbox = s.episode.world.sandbox
    t, u = (s.prepared.staging[b.batch_id] for b in case.batches)
    for query in (self_joined_ctes(12, f", {t}, {u}"), self_joined_ctes(20, f", {t}, {u}"),
                  repeated_columns(6, 20, f", {t}, {u}"), repeated_columns(4, 9, f", (SELECT 1 FROM {t}, {u} WHERE 0)"),
                  one_select(1200, 1200, 300).replace("wh_orders", t).replace("amount", '"amount"')):
        start = time.monotonic()
        result = s.call("run_sql", {"query": query})
        assert time.monotonic() - start <= sandbox.time_budget + 0.5, query[:80]
        entry = s.episode.ledger.seal()[-1]
        assert "error" in result or entry["args"]["looked_at"] == [], (query[:80], entry["args"])
    assert {t, u} <= sandbox.pending  # no look
    # one that compiles within the check's share and reads rows: the run and the look's second run, in the budget
    # (tens of milliseconds to compile here: a tenth of the share, so a loaded machine still compiles it in time)
    start = time.monotonic()
    assert s.call("run_sql", {"query": one_select(150, 150, 120).replace("wh_orders", t).replace(
        "amount", '"amount"')})["rows"]
    assert time.monotonic() - start <= sandbox.time_budget + 0.5
    assert s.call("run_sql", {"query": f"SELECT COUNT(*) FROM (SELECT * FROM {t})"})["rows"]  # a look, as ever
    assert t not in sandbox.pending
    s.finish()


def test_run_sql_returns_within_its_budget_on_a_20_row_case():
    assert_within_budget(CASES[CASE])


@pytest.mark.slow
def test_run_sql_returns_within_its_budget_on_a_200000_row_case():
    from gate_pipeline.kernel.contract import load_contract
    from gate_pipeline.suites.v2.generator import EVAL_BASE_SEED, generate_case
    case = load_case(generate_case("big", "partial-defect", 0, EVAL_BASE_SEED, load_contract("v2"), 200_000))
    assert case.batches[0].data["row_count"] > 100_000 or case.batches[1].data["row_count"] > 100_000
    assert_within_budget(case)
