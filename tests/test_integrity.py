"""Scores nobody can forge: every way of editing a stored episode is caught by `gate verify` and
grades the episode 0 with the reason; one unreadable row never stops the others being graded;
two `gate run`s cannot share a run; many processes can open a new store at once."""
from __future__ import annotations

import json
import multiprocessing
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.agents import AgentSpec
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play, prepare
from gate_pipeline.kernel.grading import grade_stored
from gate_pipeline.kernel.ledger import Ledger
from gate_pipeline.kernel.settings import Settings
from gate_pipeline.store import RunStore, StoreSink

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
CASES = {c.case_id: c for c in read_cases(EVAL)}
BAD_CASE = "eval-amount-bounds-0"  # one defective batch, one clean


class LoadsAfterReporting:
    """Oracle: reports a correct night, loads the clean batch, and only after the report loads the
    defective one (a load after the report still counts against it)."""
    oracle = True

    def play(self, tools, case=None):
        bad = [b["batch_id"] for b in case["batches"] if b["truth"]["defective"]]
        good = [b["batch_id"] for b in case["batches"] if not b["truth"]["defective"]]
        listing = tools("list_batches")
        for b in listing:
            tools("profile_batch", batch_id=b["batch_id"])
        for bid in good:
            tools("load_batch", batch_id=bid)
        tools("submit_report", loaded=good, quarantined=[])
        for bid in bad:
            tools("load_batch", batch_id=bid)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stored_episode(agent="naive", case_id=BAD_CASE):
    store = RunStore()
    result = play(prepare(CASES[case_id]), agent, sinks=[StoreSink(store)], run_id="run-1")
    return store, result


def db(home) -> sqlite3.Connection:
    return sqlite3.connect(home / "runs.db", isolation_level=None)


def verify(capsys, *args) -> tuple[int, str]:
    code = main(["verify", *args])
    return code, capsys.readouterr().out


def test_an_untouched_store_verifies_and_grades_as_played(home, capsys):
    store, result = stored_episode("careful-sql")
    assert grade_stored(store.load(result.episode_id)) == result.grade
    code, out = verify(capsys)
    assert code == 0 and "1 episodes checked" in out and "every check holds" in out


class ListsALot:
    """Lists the batches many times over (more ledger entries than one of the store's INSERTs writes), then
    quarantines nothing and loads everything."""

    def play(self, tools, case=None):
        from gate_pipeline.store import LEDGER_AT_ONCE
        for _ in range(2 * LEDGER_AT_ONCE + 5):
            listing = tools("list_batches")
        for b in listing:
            tools("load_batch", batch_id=b["batch_id"])
        tools("submit_report", loaded=[b["batch_id"] for b in listing], quarantined=[])


def test_a_long_ledger_is_stored_whole_in_order_and_verifies(home, capsys):
    """The store writes an episode's ledger entries several to an INSERT: a ledger longer than one INSERT
    takes is stored whole, in order, and grades and verifies as played."""
    from gate_pipeline.store import LEDGER_AT_ONCE
    store, result = stored_episode(AgentSpec("lists-a-lot", {}, ListsALot, "lists-a-lot"))
    assert len(result.ledger) > 2 * LEDGER_AT_ONCE
    assert store.entries(result.episode_id) == result.ledger
    assert grade_stored(store.load(result.episode_id)) == result.grade
    code, out = verify(capsys)
    assert code == 0 and "every check holds" in out


def test_cutting_the_ledger_after_the_report_is_caught(home, capsys):
    spec = AgentSpec("loads-after-reporting", {}, LoadsAfterReporting, "loads-after-reporting")
    store, result = stored_episode(spec)
    assert result.grade.reward < 1.0 and result.grade.bad_batches_loaded == 1
    report_seq = next(e["seq"] for e in result.ledger if e["action"] == "submit_report")
    db(home).execute("DELETE FROM ledger_entries WHERE episode_id = ? AND seq > ?", (result.episode_id, report_seq))
    cut = store.load(result.episode_id)
    assert any("entries;" in p for p in cut.problems)
    g = grade_stored(cut)
    assert g.reward == 0.0 and g.failed and "entries" in g.reason  # not the 1.0 the cut ledger alone would give
    code, out = verify(capsys)
    assert code == 1 and result.episode_id in out and "the ledger has" in out


def forge_chain(home, episode_id, entries):
    """Rewrite an episode's ledger rows with a freshly hashed chain of `entries` (action, args, executed, note)."""
    ledger = Ledger()
    for action, args, executed, note in entries:
        ledger.append(action, args, executed, note)
    conn = db(home)
    conn.execute("DELETE FROM ledger_entries WHERE episode_id = ?", (episode_id,))
    conn.executemany("INSERT INTO ledger_entries VALUES (?, ?, ?)",
                     [(episode_id, e["seq"], json.dumps(e, sort_keys=True)) for e in ledger.entries])
    return ledger.entries


def test_a_rehashed_forged_chain_is_caught_even_with_its_digest_updated(home, capsys):
    store, result = stored_episode("naive")
    original = [(e["action"], e["args"], e["executed"], e["note"]) for e in result.ledger]
    bad = next(b.batch_id for b in CASES[BAD_CASE].batches if b.defective)
    forged = [e for e in original if not (e[0] == "load_batch" and e[1]["batch_id"] == bad)]
    forged.insert(-1, ("quarantine_batch", {"batch_id": bad, "column": "amount", "defect_type": "out_of_range"},
                       True, ""))
    entries = forge_chain(home, result.episode_id, forged)
    assert "does not end on the hash" in " ".join(store.load(result.episode_id).problems)
    # the forger also writes the new digest and length into the episode's row: the seal catches it
    db(home).execute("UPDATE episodes SET ledger_digest = ?, ledger_entries = ? WHERE episode_id = ?",
                     (entries[-1]["hash"], len(entries), result.episode_id))
    problems = store.load(result.episode_id).problems
    assert problems == ("the episode's record was altered (its seal does not match)",)
    assert grade_stored(store.load(result.episode_id)).reward == 0.0
    code, out = verify(capsys)
    assert code == 1 and "seal does not match" in out


def test_appending_a_forged_entry_is_caught(home):
    store, result = stored_episode("naive")
    last = result.ledger[-1]
    forged = Ledger()
    forged.entries = [dict(e) for e in result.ledger]  # continue the real chain by one entry
    extra = forged.append("quarantine_batch", {"batch_id": "B-x", "column": "amount", "defect_type": "out_of_range"},
                          True)
    assert extra["prev_hash"] == last["hash"]
    db(home).execute("INSERT INTO ledger_entries VALUES (?, ?, ?)",
                     (result.episode_id, extra["seq"], json.dumps(extra, sort_keys=True)))
    problems = " ".join(store.load(result.episode_id).problems)
    assert "entries" in problems and "hash recorded" in problems


def stored_case(home, episode_id) -> tuple[str, dict]:
    """(its SHA-256, the case) of an episode as the store keeps it: once, in `cases`, under the hash its row records."""
    digest = db(home).execute("SELECT case_sha256 FROM episodes WHERE episode_id = ?", (episode_id,)).fetchone()[0]
    text = db(home).execute("SELECT case_json FROM cases WHERE case_sha256 = ?", (digest,)).fetchone()[0]
    return digest, json.loads(text)


def test_editing_the_stored_truth_labels_is_caught(home, capsys):
    store, result = stored_episode("naive")
    digest, case = stored_case(home, result.episode_id)
    for batch in case["batches"]:
        batch["truth"] = {"defective": False, "defects": []}  # naive would now be right everywhere
    text = json.dumps(case, sort_keys=True)
    db(home).execute("UPDATE cases SET case_json = ? WHERE case_sha256 = ?", (text, digest))
    assert "stored case was altered" in " ".join(store.load(result.episode_id).problems)
    import hashlib
    forged = hashlib.sha256(text.encode()).hexdigest()
    db(home).execute("UPDATE cases SET case_sha256 = ? WHERE case_sha256 = ?", (forged, digest))
    db(home).execute("UPDATE episodes SET case_sha256 = ? WHERE episode_id = ?", (forged, result.episode_id))
    assert store.load(result.episode_id).problems == ("the episode's record was altered (its seal does not match)",)
    assert grade_stored(store.load(result.episode_id)).reward == 0.0
    code, _ = verify(capsys)
    assert code == 1


def test_an_edited_case_written_into_the_episodes_row_is_caught(home, capsys):
    """The row's own case_json (where schema 5 kept every episode's case) is read before `cases`: an edited case
    put there is checked against the sealed hash as the kept one is."""
    store, result = stored_episode("naive")
    _, case = stored_case(home, result.episode_id)
    case["batches"][0]["truth"] = {"defective": False, "defects": []}
    db(home).execute("UPDATE episodes SET case_json = ? WHERE episode_id = ?",
                     (json.dumps(case, sort_keys=True), result.episode_id))
    assert "stored case was altered" in " ".join(store.load(result.episode_id).problems)
    db(home).execute("UPDATE episodes SET case_json = 7 WHERE episode_id = ?", (result.episode_id,))
    assert "stored case was altered" in " ".join(store.load(result.episode_id).problems)
    code, _ = verify(capsys)
    assert code == 1


def test_a_case_that_is_not_the_one_recorded_is_not_read_as_one(home):
    """A stored case whose SHA-256 is not the one its sealed row records was parsed and checked all the same: text
    planted under a case's hash (the store's writer can put any there) cost verify the time and memory of reading
    it as a case, for every episode of the case, and an edited one was graded against (at 0, but as that case).
    Such text is named altered and never parsed."""
    store, result = stored_episode("naive")
    digest, case = stored_case(home, result.episode_id)
    case["batches"][0]["truth"] = {"defective": False, "defects": []}
    db(home).execute("UPDATE cases SET case_json = ? WHERE case_sha256 = ?", (json.dumps(case, sort_keys=True), digest))
    edited = store.load(result.episode_id)
    assert edited.case is None and edited.problems == (
        "the stored case was altered (its SHA-256 differs from the one recorded)",)
    assert grade_stored(edited).reward == 0.0 and grade_stored(edited).failed
    db(home).execute("UPDATE cases SET case_json = ? WHERE case_sha256 = ?", ("[" * 100_000, digest))
    assert store.load(result.episode_id).problems == (  # not also "not readable JSON": it was not read
        "the stored case was altered (its SHA-256 differs from the one recorded)",)


def test_a_transactions_new_cases_go_in_the_order_of_their_hashes(home):
    """Two transactions that store the same new cases at once take them in one order (on PostgreSQL the second
    waits for the first on each case: in opposite orders they would wait for each other)."""
    from gate_pipeline.kernel.engine import EpisodeStart
    store = RunStore()
    starts = [EpisodeStart(f"e{k}", case, "naive", {}, "r", 0, 0.0) for k, case in enumerate(CASES.values())]
    forward = [row["case_sha256"] for row in store._case_rows(starts)]
    assert forward == sorted(forward) and len(forward) == len(CASES)
    assert [row["case_sha256"] for row in store._case_rows(starts[::-1])] == forward


def test_a_case_planted_before_it_is_played_is_written_over(home, capsys):
    """Whoever can edit the database can put any text under a case's hash before the case is first played: the
    episode that plays it then stores the case's own text there, and grades as it played."""
    import hashlib
    case = CASES["eval-clean-control-0"]
    text = json.dumps(case.data, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    RunStore().dispose()
    db(home).execute("INSERT INTO cases VALUES (?, ?)", (digest, "{}"))
    store, result = stored_episode("careful-sql", "eval-clean-control-0")
    assert db(home).execute("SELECT case_json FROM cases WHERE case_sha256 = ?", (digest,)).fetchone()[0] == text
    assert store.load(result.episode_id).problems == () and grade_stored(store.load(result.episode_id)) == result.grade
    code, _ = verify(capsys)
    assert code == 0


def test_a_case_that_is_not_utf8_or_a_seal_that_is_not_ascii_is_a_problem_not_a_traceback(home):
    """SQLite keeps whatever bytes an edit of the file writes as text, and its driver raises on those that are not
    UTF-8: a case's are read as U+FFFD, so such a case fails its hash. A seal of text that is not ASCII (which
    `hmac.compare_digest` refuses) fails as any other edited seal. Each is a named problem; verify goes on."""
    store, result = stored_episode("naive")
    _, other = stored_episode("careful", "eval-clean-control-0")
    digest, _ = stored_case(home, result.episode_id)
    db(home).execute("UPDATE cases SET case_json = CAST(x'ff7b' AS TEXT) WHERE case_sha256 = ?", (digest,))
    assert store.load(result.episode_id).problems == (
        "the stored case was altered (its SHA-256 differs from the one recorded)",)
    db(home).execute("UPDATE episodes SET seal = ? WHERE episode_id = ?", ("\u00e9" * 64, other.episode_id))
    assert store.load(other.episode_id).problems == ("the episode's record was altered (its seal does not match)",)
    store.dispose()
    p = gate_verify(home)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"{result.episode_id} {BAD_CASE} naive: the stored case was altered" in p.stdout
    assert f"{other.episode_id} eval-clean-control-0 careful: the episode's record was altered" in p.stdout, p.stdout


def test_a_sealed_case_that_is_not_utf8_is_a_problem_not_a_traceback(home):
    """Whoever holds the key can store bytes that are not UTF-8 under their own SHA-256 and seal an episode's row
    with that hash: read as bytes, hashed, then decoded, such a case raised out of `gate verify`."""
    import hashlib
    store, result = stored_episode("naive")
    digest, _ = stored_case(home, result.episode_id)
    raw = db(home).execute("SELECT CAST(case_json AS BLOB) FROM cases WHERE case_sha256 = ?", (digest,)).fetchone()[0]
    forged = raw[:-1] + b" \xff}"
    forged_sha256 = hashlib.sha256(forged).hexdigest()
    db(home).execute("INSERT INTO cases VALUES (?, CAST(? AS TEXT))", (forged_sha256, forged))
    db(home).execute("UPDATE episodes SET case_sha256 = ? WHERE episode_id = ?", (forged_sha256, result.episode_id))
    db(home).execute("UPDATE episodes SET seal = ? WHERE episode_id = ?",
                     (store.seal(store.episode(result.episode_id)), result.episode_id))
    assert store.load(result.episode_id).problems == ("the stored case is not UTF-8 text",)
    store.dispose()
    p = gate_verify(home)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"{result.episode_id} {BAD_CASE} naive: the stored case is not UTF-8 text" in p.stdout, p.stdout


class Talks:
    """Reports an empty night and keeps a log of its own (stored as the episode's transcript)."""
    oracle = False

    def play(self, tools, case=None):
        tools("submit_report", loaded=[], quarantined=[])

    def episode_log(self):
        return {"said": "nothing to load"}


def test_stored_text_that_is_not_utf8_is_named_wherever_it_is(home):
    """SQLite's driver raises on text that is not UTF-8, which an edit of the file can leave in any column: every
    read of what the store keeps is made again with such bytes as U+FFFD (text gate never wrote), so the rows
    holding it fail their seal or hash, and nothing stops at them: verify names each, grades and manifests read."""
    store, first = stored_episode("naive")
    episodes = [first] + [stored_episode(agent, case)[1] for agent, case in
                          (("careful", BAD_CASE), ("naive", "eval-clean-control-0"), ("careful", "eval-clean-control-0"))]
    conn = db(home)
    bad = "CAST(CAST({} AS BLOB) || x'ff' AS TEXT)"
    conn.execute(f"UPDATE episodes SET error = {bad.format(repr('x'))} WHERE episode_id = ?", (episodes[0].episode_id,))
    conn.execute(f"UPDATE episodes SET agent = {bad.format('agent')} WHERE episode_id = ?", (episodes[1].episode_id,))
    conn.execute(f"UPDATE episodes SET episode_id = {bad.format('episode_id')} WHERE episode_id = ?",
                 (episodes[2].episode_id,))
    conn.execute(f"UPDATE ledger_entries SET entry = {bad.format('entry')} WHERE episode_id = ? AND seq = 0",
                 (episodes[3].episode_id,))
    talked = stored_episode(AgentSpec("talks", factory=Talks, identity="talks"), "eval-clean-control-1")[1]
    episodes.append(talked)
    conn.execute(f"UPDATE transcripts SET log = {bad.format('log')} WHERE episode_id = ?", (talked.episode_id,))
    conn.execute(f"UPDATE manifests SET run_id = {bad.format('run_id')}")
    reader = RunStore()
    assert len(reader.episodes()) == 5 and len(reader.ungraded()) == 5 and len(reader.manifests()) == 1
    reader.close_dead_runs()
    reader.dispose()
    p = gate_verify(home)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    for e, said in zip(episodes, ("seal does not match", "seal does not match", "no episode", "hash chain is broken",
                                  "transcript was altered")):
        assert any(line.startswith(e.episode_id) and said in line for line in p.stdout.splitlines()), (said, p.stdout)


def test_a_case_deleted_from_the_store_is_caught(home, capsys):
    store, result = stored_episode("naive")
    digest, _ = stored_case(home, result.episode_id)
    db(home).execute("DELETE FROM cases WHERE case_sha256 = ?", (digest,))
    problems = store.load(result.episode_id).problems
    assert problems == ("the episode's case is missing from the run store",)
    assert grade_stored(store.load(result.episode_id)).reward == 0.0
    code, _ = verify(capsys)
    assert code == 1


def test_a_case_is_kept_once_however_many_episodes_play_it(home):
    """Every agent's episode of a case, in any run, in this process or another, refers to one copy of it."""
    store, first = stored_episode("naive")
    stored_episode("careful")
    _, other = stored_episode("naive", "eval-clean-control-0")
    RunStore().dispose()
    code = ("from gate_pipeline.kernel.cases import read_cases\n"
            "from gate_pipeline.kernel.engine import play, prepare\n"
            "from gate_pipeline.store import RunStore, StoreSink\n"
            f"case = {{c.case_id: c for c in read_cases({str(EVAL)!r})}}[{BAD_CASE!r}]\n"
            "play(prepare(case), 'refuse-all', sinks=[StoreSink(RunStore())], run_id='run-2')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    conn = db(home)
    assert conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0] == 4
    assert conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0] == 2
    assert conn.execute("SELECT COUNT(*) FROM episodes WHERE case_json != ''").fetchone()[0] == 0
    for eid in conn.execute("SELECT episode_id FROM episodes").fetchall():
        assert store.load(eid[0]).problems == ()
    assert store.load(first.episode_id).case == CASES[BAD_CASE]
    assert store.load(other.episode_id).case_json == CASES["eval-clean-control-0"].line().rstrip("\n")


def test_editing_the_saved_warehouse_is_caught(home, capsys):
    store, result = stored_episode("naive")
    name = store.episode(result.episode_id)["warehouse"]
    conn = sqlite3.connect(":memory:")
    conn.deserialize(store.warehouse_image(result.episode_id))
    conn.execute("DELETE FROM wh_orders WHERE amount > 50000")  # take the bad rows back out
    conn.commit()
    edited = conn.serialize()
    conn.close()
    db(home).execute("UPDATE warehouses SET image = ? WHERE episode_id = ?", (edited, result.episode_id))
    problems = store.load(result.episode_id).problems
    assert problems == (f"warehouse {name} was altered (its SHA-256 differs from the one recorded)",)
    g = grade_stored(store.load(result.episode_id))
    assert g.reward == 0.0 and g.failed and "warehouse" in g.reason
    db(home).execute("DELETE FROM warehouses WHERE episode_id = ?", (result.episode_id,))
    assert "missing" in " ".join(store.load(result.episode_id).problems)
    code, out = verify(capsys, "--json")
    assert code == 1 and json.loads(out)["episodes_with_problems"] == 1


def test_a_kept_grade_that_was_raised_is_caught(home, capsys):
    store, result = stored_episode("naive")
    store.add_grade(result.episode_id, "naive", result.grade)
    assert verify(capsys)[0] == 0
    kept = json.loads(db(home).execute("SELECT grade FROM grades").fetchone()[0])
    kept["reward"] = 1.0
    db(home).execute("UPDATE grades SET grade = ?", (json.dumps(kept),))
    code, out = verify(capsys)
    assert code == 1 and "kept grade differs from a fresh grade in reward" in out


def test_the_grading_sensor_reads_no_more_kept_grades_than_a_tick_publishes(home):
    """The sensor read every kept grade after its cursor (each parsed) and kept the first 500: on a store of many
    nights, a tick after its cursor was reset read them all. The limit is the query's now."""
    store, result = stored_episode("naive")
    store.add_grade(result.episode_id, "naive", result.grade)
    kept = db(home).execute("SELECT episode_id, case_id, agent, grade, graded_at FROM grades").fetchone()
    db(home).executemany("INSERT INTO grades (episode_id, case_id, agent, grade, graded_at) VALUES (?, ?, ?, ?, ?)",
                         [(f"copy-{i}", *kept[1:]) for i in range(30)])
    assert [seq for seq, _ in store.grades_after(0, 5)] == [1, 2, 3, 4, 5]
    assert [seq for seq, _ in store.grades_after(29, 5)] == [30, 31] and len(store.grades_after(0)) == 31


def test_the_nightly_history_reads_the_nights_it_shows_not_every_kept_one(home):
    """The history read every kept summary (each parsed and its seal checked) to show the last 30: a store of years
    of nights was read whole by every scoreboard. It reads them newest first, a page at a time, and still skips one
    whose seal does not hold however many of the newest do not."""
    from gate_pipeline.store import NIGHTS_PAGE
    store = RunStore()
    total = 2 * NIGHTS_PAGE + NIGHTS_PAGE // 2
    for night in range(total):
        store.add_nightly({"agents": {"naive": {"reward": night / 1000}}}, f"run-{night}")
    db(home).execute("UPDATE nightly_scores SET summary = replace(summary, 'reward', 'rewarD') WHERE night_seq > ?",
                     (total - NIGHTS_PAGE - 2,))  # the newest page and two more edited without the key: never shown
    read: list[int] = []
    rows = store._rows
    store._rows = lambda query: read.append(len(got := rows(query))) or got  # type: ignore[method-assign]
    last = total - NIGHTS_PAGE - 3  # the newest that holds
    assert [n["run_id"] for n in store.nightly_history(3)] == [f"run-{k}" for k in range(last - 2, last + 1)]
    assert read == [NIGHTS_PAGE, NIGHTS_PAGE]  # a second page for the nights past the edited ones, no more
    read.clear()
    assert [n["run_id"] for n in store.nightly_history(30)] == [f"run-{k}" for k in range(last - 29, last + 1)]
    assert read == [NIGHTS_PAGE, NIGHTS_PAGE] and store.nightly_history(0) == [] and store.nightly_history(-1) == []
    assert len(store.nightly_history(2 ** 63)) == last + 1  # every night that holds, in pages


def test_an_unreadable_ledger_row_fails_its_episode_only(home):
    import dagster as dg

    from gate_pipeline.dagster_defs.definitions import defs
    store, broken = stored_episode("careful-sql", "eval-resent-rows-0")
    _, fine = stored_episode("careful-sql", "eval-label-drift-1")
    db(home).execute("UPDATE ledger_entries SET entry = substr(entry, 1, 20) WHERE episode_id = ? AND seq = 2",
                     (broken.episode_id,))
    with dg.DagsterInstance.ephemeral() as instance:
        from gate_pipeline.dagster_defs.resources import GateStore
        context = dg.build_sensor_context(instance=instance, resources={"gate_store": GateStore()})
        data = defs.resolve_sensor_def("grading_sensor").evaluate_tick(context)
    observed = {e.metadata["careful-sql/episode_id"].value: e.metadata for e in data.asset_events}  # keyed by agent
    assert set(observed) == {broken.episode_id, fine.episode_id}
    assert observed[fine.episode_id]["careful-sql/reward"].value == 1.0
    assert observed[broken.episode_id]["careful-sql/reward"].value == 0.0
    assert "ledger entry 2 is not readable" in observed[broken.episode_id]["careful-sql/reason"].value


def _open_store(home: str, queue) -> None:
    try:
        RunStore(Settings(home=Path(home))).dispose()
        queue.put("ok")
    except Exception as exc:  # noqa: BLE001 - the test reports what failed
        queue.put(f"{type(exc).__name__}: {exc}")


def test_twelve_processes_can_open_a_new_store_at_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_open_store, args=(str(tmp_path / "fresh"), queue)) for _ in range(12)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    outcomes = [queue.get(timeout=10) for _ in procs]
    assert outcomes == ["ok"] * 12, outcomes
    key = (tmp_path / "fresh" / "store.key")
    assert len(key.read_text()) == 64 and oct(key.stat().st_mode & 0o777) == "0o600"


def test_a_second_gate_run_with_the_same_id_is_refused(tmp_path):
    from gate_pipeline.model_agent.rollouts import RunError, run_lock
    run_dir = tmp_path / "runs" / "same"
    with run_lock(run_dir):
        code = ("import sys; from pathlib import Path; from gate_pipeline.model_agent.rollouts import run_lock\n"
                f"with run_lock(Path({str(run_dir)!r})): pass\n")
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert other.returncode != 0 and "is being played by process" in other.stderr
        with pytest.raises(RunError, match="is being played by process"):
            with run_lock(run_dir):
                pass
    with run_lock(run_dir):  # free again once the first is done
        pass


def inline_cases(conn: sqlite3.Connection) -> None:
    """Put each episode's case in its row and drop the `cases` table, as schemas 3 to 5 kept them."""
    conn.execute("UPDATE episodes SET case_json = (SELECT case_json FROM cases WHERE cases.case_sha256 = "
                 "episodes.case_sha256)")
    conn.execute("DROP TABLE cases")


def make_old_store(home, store: RunStore, version: str) -> None:
    """Turn a store into the one schema 3 or 4 wrote: no agent names, transcripts, manifests, key id or `cases`
    table, each episode sealed over the fields those schemas sealed."""
    import hashlib
    import hmac

    from gate_pipeline.store import SEALED
    conn = db(home)
    inline_cases(conn)
    cols = [c[1] for c in conn.execute("PRAGMA table_info(episodes)")]
    for values in conn.execute("SELECT * FROM episodes").fetchall():
        row = dict(zip(cols, values))
        seal = hmac.new(store.key, json.dumps([row[k] for k in SEALED]).encode(), hashlib.sha256).hexdigest()
        conn.execute("UPDATE episodes SET seal = ? WHERE episode_id = ?", (seal, row["episode_id"]))
    for column in ("agent_name", "transcript_sha256"):
        conn.execute(f"ALTER TABLE episodes DROP COLUMN {column}")
    for table in ("manifests", "transcripts"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DELETE FROM gate_store WHERE key = 'key_id'")
    conn.execute("UPDATE gate_store SET value = ? WHERE key = 'schema'", (version,))
    store.dispose()


def test_a_schema_3_store_is_migrated_with_its_warehouse_files(home, capsys):
    """Schema 3 kept warehouses as files under GATE_HOME: opening it copies them into the database,
    once; the seals still hold, a file that was lost stays a problem, an older schema is refused."""
    store, result = stored_episode("naive")
    _, other = stored_episode("careful")
    for ep in (result, other):  # make it the store schema 3 wrote
        path = home / store.episode(ep.episode_id)["warehouse"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.warehouse_image(ep.episode_id))
    (home / store.episode(other.episode_id)["warehouse"]).unlink()  # one file lost before the upgrade
    db(home).execute("DELETE FROM warehouses")
    make_old_store(home, store, "3")
    migrated = RunStore()
    assert db(home).execute("SELECT value FROM gate_store WHERE key = 'schema'").fetchone()[0] == "6"
    assert migrated.load(result.episode_id).problems == ()
    assert grade_stored(migrated.load(result.episode_id)) == result.grade
    assert "missing from the run store" in " ".join(migrated.load(other.episode_id).problems)
    RunStore().dispose()  # opening it again migrates nothing twice
    assert db(home).execute("SELECT COUNT(*) FROM warehouses").fetchone()[0] == 1
    db(home).execute("UPDATE gate_store SET value = '2' WHERE key = 'schema'")
    with pytest.raises(Exception, match="has schema 2; this gate reads 6"):
        RunStore()


def test_a_schema_4_store_is_migrated_and_still_verifies(home, capsys):
    """Schema 4 had no agent names, transcripts, manifests or key id: its seals still hold after the
    migration, its episodes are played again by their agent, and an edit is still caught."""
    store, result = stored_episode("careful-sql")
    make_old_store(home, store, "4")
    migrated = RunStore()
    assert migrated.load(result.episode_id).problems == ()
    code, out = verify(capsys)
    assert code == 0 and "played again 1," in out and "every check holds" in out
    db(home).execute("UPDATE episodes SET agent = 'naive' WHERE episode_id = ?", (result.episode_id,))
    code, out = verify(capsys)
    assert code == 1 and "seal does not match" in out


def test_a_schema_5_store_is_migrated_its_rows_keeping_their_cases(home, capsys):
    """Schema 5 kept a copy of the case in every episode's row: after the migration those rows are read as they
    are (their seals hold, verify plays them again), episodes stored after keep their case in `cases`, an edit
    of an old row's case is still caught, and a reader never migrates."""
    store, result = stored_episode("careful-sql")
    conn = db(home)
    inline_cases(conn)
    conn.execute("UPDATE gate_store SET value = '5' WHERE key = 'schema'")
    store.dispose()
    p = gate_verify(home)
    assert p.returncode == 2 and "has schema 5: the first command that writes to it" in p.stderr
    assert conn.execute("SELECT value FROM gate_store WHERE key = 'schema'").fetchone()[0] == "5"
    migrated, later = stored_episode("naive")
    assert conn.execute("SELECT value FROM gate_store WHERE key = 'schema'").fetchone()[0] == "6"
    assert migrated.load(result.episode_id).problems == () and migrated.load(later.episode_id).problems == ()
    assert conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM episodes WHERE case_json != ''").fetchone()[0] == 1
    code, out = verify(capsys)
    assert code == 0 and "played again 2," in out and "every check holds" in out
    old = json.loads(conn.execute("SELECT case_json FROM episodes WHERE episode_id = ?", (result.episode_id,))
                     .fetchone()[0])
    old["batches"][0]["truth"] = {"defective": False, "defects": []}
    conn.execute("UPDATE episodes SET case_json = ? WHERE episode_id = ?",
                 (json.dumps(old, sort_keys=True), result.episode_id))
    assert "stored case was altered" in " ".join(migrated.load(result.episode_id).problems)


HOSTILE_VIEW = ("CREATE VIEW wh_orders AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
                "SELECT x AS amount, 'C' AS customer_id FROM r; CREATE TABLE wh_customers(customer_id); "
                "INSERT INTO wh_customers VALUES ('C');")


def hostile_image() -> bytes:
    conn = sqlite3.connect(":memory:")
    conn.executescript(HOSTILE_VIEW)
    return conn.serialize()


def gate_verify(home, timeout: float = 120) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-m", "gate_pipeline.cli.main", "verify"], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "GATE_HOME": str(home)})


@pytest.mark.parametrize("resealed", [False, True])
def test_a_hostile_warehouse_image_is_never_queried_unbounded(home, resealed):
    """A warehouse image whose wh_orders is a view over an endless recursive query: with no hash recorded it is
    not queried at all; with its hash and the row re-sealed (the key's holder) the query stops at a budget."""
    import hashlib
    store, result = stored_episode("naive")
    image = hostile_image()
    conn = db(home)
    conn.execute("UPDATE warehouses SET image = ? WHERE episode_id = ?", (image, result.episode_id))
    conn.execute("UPDATE episodes SET warehouse_sha256 = ? WHERE episode_id = ?",
                 (hashlib.sha256(image).hexdigest() if resealed else None, result.episode_id))
    if resealed:
        conn.execute("UPDATE episodes SET seal = ? WHERE episode_id = ?",
                     (store.seal(store.episode(result.episode_id)), result.episode_id))
    store.dispose()
    p = gate_verify(home)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert ("did not finish within" if resealed else "has no SHA-256 recorded: it is not read") in p.stdout


def test_ctrl_c_stops_reading_a_hostile_warehouse(tmp_path):
    """SQLite runs the query in C: without a progress handler Python never sees Ctrl-C. With one, Ctrl-C is a
    KeyboardInterrupt (the CLI's `gate: interrupted`), not an unreadable warehouse."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import hashlib, os, signal, sqlite3, threading, time\n"
        "from gate_pipeline.store import read_mart\n"
        f"conn = sqlite3.connect(':memory:'); conn.executescript({HOSTILE_VIEW!r}); image = conn.serialize()\n"
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    read_mart(image, 'w', hashlib.sha256(image).hexdigest())\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after', round(time.monotonic() - start, 1))\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert p.stdout.startswith("interrupted after 0.3"), (p.stdout, p.stderr[-2000:])


def test_ctrl_c_during_one_long_step_past_the_budget_is_still_an_interrupt(tmp_path):
    """SQLite runs one long step (instr over a 600,000-character text) in C, then more rows: Ctrl-C comes to
    Python only at the next callback, after the deadline. It is still Ctrl-C, not a warehouse over its budget."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import hashlib, os, signal, sqlite3, threading, time\n"
        "from gate_pipeline import store\n"
        "store.MART_TIME_BUDGET_S = 0.3\n"
        "conn = sqlite3.connect(':memory:')\n"
        "conn.executescript(\"CREATE TABLE h(hay, needle); CREATE VIEW wh_orders AS SELECT instr(hay, needle) AS \"\n"
        "                   \"amount, 'C' AS customer_id FROM h UNION ALL SELECT 0, 'C' FROM (WITH RECURSIVE r(n) AS \"\n"
        "                   \"(SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10000) SELECT n FROM r); \"\n"
        "                   \"CREATE TABLE wh_customers(customer_id); INSERT INTO wh_customers VALUES ('C');\")\n"
        "conn.execute('INSERT INTO h VALUES (?, ?)', ('a' * 600_000, 'a' * 299_999 + 'b')); conn.commit()\n"
        "image = conn.serialize()\n"
        "threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    store.read_mart(image, 'w', hashlib.sha256(image).hexdigest())\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
        "except store.StoreError as exc:\n"
        "    print(exc)\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.stdout == "interrupted\n", (p.stdout, p.stderr[-2000:])


@pytest.mark.parametrize("name", ["not authorized", "interrupted"])
def test_a_table_named_like_a_stop_is_an_unreadable_warehouse_not_an_interrupt(name):
    """The stored data chooses the words of some errors (a table it names and then drops): an error only
    reads as a stop of the sandbox's callbacks when it is exactly one, so verify is not stopped as if by Ctrl-C."""
    import hashlib

    from gate_pipeline.store import StoreError, read_mart
    conn = sqlite3.connect(":memory:")
    conn.executescript(f'CREATE TABLE "{name}"(amount, customer_id); CREATE VIEW wh_orders AS SELECT * FROM "{name}"; '
                       f'DROP TABLE "{name}"; CREATE TABLE wh_customers(customer_id);')
    image = conn.serialize()
    with pytest.raises(StoreError, match=f"warehouse w is unreadable .*no such table: main.{name}"):
        read_mart(image, "w", hashlib.sha256(image).hexdigest())


def test_a_warehouse_image_calling_a_refused_function_is_unreadable_not_an_interrupt():
    """A view calling a function agent SQL may not call (printf fills a billion characters inside one step)
    is refused by the sandbox the mart is read in: an unreadable warehouse, not taken for a Ctrl-C."""
    import hashlib

    from gate_pipeline.store import StoreError, read_mart
    conn = sqlite3.connect(":memory:")
    conn.executescript("CREATE VIEW wh_orders AS SELECT length(printf('%.*c', 1000000000, 'x')) AS amount, "
                       "'C' AS customer_id; CREATE TABLE wh_customers(customer_id); "
                       "INSERT INTO wh_customers VALUES ('C');")
    image = conn.serialize()
    with pytest.raises(StoreError, match=r"warehouse w is unreadable \(not authorized to use function: printf\)"):
        read_mart(image, "w", hashlib.sha256(image).hexdigest())


def test_a_stored_warehouse_is_read_as_gate_computed_its_mart():
    """Agent SQL's limits are not verify's: a value longer than a query of the agent's may produce (a customer
    id of 30,000 characters) is read, and the mart is what the engine's own read of the same database gives."""
    import hashlib

    from gate_pipeline.kernel.world import mart_revenue
    from gate_pipeline.store import read_mart
    conn = sqlite3.connect(":memory:")
    conn.executescript("CREATE TABLE wh_orders(order_id, customer_id, amount); CREATE TABLE wh_customers(customer_id);")
    conn.execute("INSERT INTO wh_customers VALUES (?)", ("C" * 30_000,))
    conn.executemany("INSERT INTO wh_orders VALUES (?, ?, ?)", [("o1", "C" * 30_000, 12.5), ("o2", "D", 4.0)])
    conn.commit()
    image = conn.serialize()
    assert read_mart(image, "w", hashlib.sha256(image).hexdigest()) == mart_revenue(conn) == 12.5


def store_bytes(home) -> bytes:
    conn = db(home)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return (home / "runs.db").read_bytes()


@pytest.mark.parametrize("edit,code,needle", [
    ("DELETE FROM gate_store WHERE key = 'key_id'", 1, "records no id of the key it was sealed with"),
    ("UPDATE gate_store SET value = '3' WHERE key = 'schema'", 2, "has schema 3: the first command that writes"),
    ("DROP TABLE grades", 2, "lacks the table grades"),
    ("ALTER TABLE episodes DROP COLUMN agent_name", 2, "its table episodes lacks the column agent_name"),
])
def test_verify_changes_nothing_in_the_store_it_checks(home, tmp_path, capsys, edit, code, needle):
    """`gate verify` reads: it records no key id (not another key's), migrates nothing, creates no table;
    a store it cannot read as it is is one line."""
    store, _ = stored_episode("careful")
    store.dispose()
    db(home).execute(edit)
    other = tmp_path / "other.key"
    other.write_text("o" * 64)
    before = store_bytes(home)
    assert main(["verify", "--key-file", str(other)]) == code
    out = capsys.readouterr()
    assert needle in (out.out if code == 1 else out.err) and "Traceback" not in out.err
    if code == 2:
        assert out.err.count("\n") == 1 and out.err.startswith("gate: error: run store")
    assert store_bytes(home) == before


@pytest.mark.parametrize("name", ["wh_orders", "sqlite_grow"])
def test_a_stored_view_that_grows_as_sqlite_compiles_it_is_stopped_at_the_budget(name):
    """The stored schema is hostile too: a view whose column is repeated inside each other (20 ** 6 terms once
    expanded) takes SQLite far longer than the budget to compile for the mart's short query, asking the
    authorizer almost never. Every statement on a stored image is compiled first in the compile check's child,
    which is killed; a schema the child cannot rebuild (a view named sqlite_*, which SQLite loads from an image
    but refuses to create) is not taken as compiling (an outside review's: the child compiled nothing and said
    the statement fit)."""
    import hashlib
    import time

    from gate_pipeline.store import MART_TIME_BUDGET_S, StoreError, read_mart
    view = "SELECT 1 AS amount, 'C' AS customer_id"
    for _ in range(6):
        view = f"SELECT {'+'.join(['amount'] * 20)} AS amount, customer_id FROM ({view})"
    conn = sqlite3.connect(":memory:")
    conn.execute("PRAGMA writable_schema = ON")  # lets the forger name a view sqlite_*
    conn.executescript(f"CREATE VIEW {name} AS {view}; CREATE TABLE wh_customers(customer_id); "
                       "INSERT INTO wh_customers VALUES ('C');")
    if name != "wh_orders":
        conn.execute(f"CREATE VIEW wh_orders AS SELECT * FROM {name}")
    image = conn.serialize()
    start = time.monotonic()
    said = "did not finish within" if name == "wh_orders" else "its mart's query was not compiled: a copy of its schema"
    with pytest.raises(StoreError, match=said):
        read_mart(image, "w", hashlib.sha256(image).hexdigest())
    assert time.monotonic() - start < MART_TIME_BUDGET_S + 3


def test_a_stored_schema_is_never_renamed_for_the_compile_checks_cache(monkeypatch):
    """The compile check's cache key renames every statement of the schema by every name in it (time that grows
    with the square of the names, in the parent, outside any budget: 44 s for an image of 16,000 views in an
    outside review). A stored schema is not gate's: it is neither looked up nor kept there."""
    import hashlib

    from gate_pipeline.kernel import compile_check
    from gate_pipeline.store import read_mart

    def refused(*_):
        raise AssertionError("a stored schema was renamed")
    monkeypatch.setattr(compile_check, "_Renaming", refused)
    conn = sqlite3.connect(":memory:")
    conn.executescript("CREATE TABLE wh_customers(customer_id); CREATE TABLE wh_orders(customer_id, amount); "
                       "INSERT INTO wh_customers VALUES ('C'); INSERT INTO wh_orders VALUES ('C', 12.5); "
                       "CREATE VIEW v AS SELECT amount FROM wh_orders;")
    image = conn.serialize()
    assert read_mart(image, "w", hashlib.sha256(image).hexdigest()) == 12.5


@pytest.mark.parametrize("edit", [
    "UPDATE episodes SET status = 'running', run_id = CAST(run_id AS BLOB) WHERE episode_id = :broken",
    "UPDATE episodes SET status = 'running', run_id = 12345 WHERE episode_id = :broken",
])
def test_a_hostile_running_row_never_stops_the_grading_sensor(home, edit):
    """A running episode whose run id was edited into bytes raised Dagster's CheckError out of every tick, before
    anything was graded; a cursor of '²' (a digit to str.isdigit) or of 23 digits raised too."""
    import dagster as dg

    from gate_pipeline.dagster_defs.definitions import defs
    from gate_pipeline.dagster_defs.resources import GateStore
    from gate_pipeline.dagster_defs.sensors import last_grade
    _, broken = stored_episode("careful-sql", "eval-resent-rows-0")
    _, fine = stored_episode("careful-sql", "eval-label-drift-1")
    db(home).execute(edit, {"broken": broken.episode_id})
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_sensor_context(instance=instance, resources={"gate_store": GateStore()})
        data = defs.resolve_sensor_def("grading_sensor").evaluate_tick(context)
    observed = {e.metadata["careful-sql/episode_id"].value for e in data.asset_events}
    assert fine.episode_id in observed
    for cursor, seq in (("\u00b2", 0), ("9" * 23, 0), ("12 graded", 12), ("-5", 0), (None, 0)):
        assert last_grade(cursor) == seq
