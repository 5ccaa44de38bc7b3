"""The classic prepared database that episodes borrow: each episode finds the case as built, whatever the
episodes before it loaded; two episodes at once never share one; a kept warehouse is byte for byte what a
private copy gives."""
from __future__ import annotations

from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import Sink, play, prepare

CASES = read_cases("cases/classic/eval_curated.jsonl")


class Keep(Sink):
    wants_warehouse = True

    def end(self, result):
        self.result = result


def _rows(episode) -> tuple[int, int]:
    conn = episode.world.conn
    return tuple(conn.execute(f"SELECT COUNT(*) FROM wh_{t}").fetchone()[0] for t in ("customers", "orders"))


def test_loads_are_gone_when_the_next_episode_borrows_the_database():
    p = prepare(CASES[0])
    first = p.suite.episode(p)
    assert first.world._borrowed
    before = _rows(first)
    for b in p.listing:
        first.call("load_batch", {"batch_id": b["batch_id"]})
    assert _rows(first) != before
    first.close()
    second = p.suite.episode(p)
    assert second.world._borrowed and _rows(second) == before
    second.close()
    p.close()


def test_an_episode_opened_while_another_holds_the_database_plays_on_its_own():
    p = prepare(CASES[0])
    first, second = p.suite.episode(p), p.suite.episode(p)
    assert first.world._borrowed and not second.world._borrowed
    before = _rows(second)
    for b in p.listing:
        first.call("load_batch", {"batch_id": b["batch_id"]})
    assert _rows(second) == before  # the first one's loads are not seen by the second
    second.close()
    first.close()
    p.close()


def test_grades_and_kept_warehouses_are_the_same_borrowed_or_private():
    for case in CASES[:12]:
        p = prepare(case)
        for agent in ("naive", "careful-sql", "refuse-all"):
            borrowed = play(p, agent)
            keep = Keep()
            kept = play(p, agent, sinks=[keep])
            assert borrowed.grade == kept.grade
            held = p.suite.episode(p)  # holds the database: the next one is private
            private = play(p, agent, sinks=[Keep()])
            held.close()
            assert private.grade == borrowed.grade
            assert keep.result.warehouse is not None
        p.close()


def test_a_borrowed_world_that_is_asked_for_its_image_shows_its_loads():
    p = prepare(CASES[0])
    ep = p.suite.episode(p)
    for b in p.listing:
        ep.call("load_batch", {"batch_id": b["batch_id"]})
    import sqlite3
    copy = sqlite3.connect(":memory:")
    copy.deserialize(ep.world.image())
    assert copy.execute("SELECT COUNT(*) FROM wh_orders").fetchone()[0] == _rows(ep)[1]
    ep.close()
    p.close()


def test_closing_the_prepared_case_while_borrowed_closes_its_database_when_given_back():
    p = prepare(CASES[0])
    ep = p.suite.episode(p)
    p.close()
    assert p._db is not None  # still held
    ep.close()
    assert p._db is None


def test_a_borrowed_world_gives_the_image_a_private_one_gives():
    p = prepare(CASES[1])
    held_free = p.suite.episode(p)
    other = p.suite.episode(p)  # private: the first holds the database
    assert held_free.world._borrowed and not other.world._borrowed
    for ep in (held_free, other):
        for b in p.listing:
            ep.call("load_batch", {"batch_id": b["batch_id"]})
        ep.call("load_batch", {"batch_id": p.listing[0]["batch_id"]})
    assert held_free.world.image() == other.world.image()
    other.close()
    held_free.close()
    p.close()


def test_an_agent_cannot_end_the_borrowed_transaction_and_keep_its_loads():
    p = prepare(CASES[2])
    ep = p.suite.episode(p)
    before = _rows(ep)
    for b in p.listing:
        ep.call("load_batch", {"batch_id": b["batch_id"]})
    for statement in ("COMMIT", "END", "ROLLBACK", "RELEASE gate_load", "SAVEPOINT x", "BEGIN",
                      "PRAGMA query_only = 0", "ATTACH ':memory:' AS x", "COMMIT; SELECT 1"):
        assert "error" in ep.call("run_sql", {"query": statement}), statement
    assert p._db.in_transaction
    ep.close()
    again = p.suite.episode(p)
    assert again.world._borrowed and _rows(again) == before
    again.close()
    p.close()
