"""Results nobody can forge: each attack the run store had no answer to, reproduced, and shown closed.

The attacker here can write GATE_HOME (the database and, by default, the key beside it). Each test
first shows the forgery passing the store's own checks (what `gate verify` relied on before), then
`gate verify` failing it, naming what is wrong."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.jobs import nightly_run_config, play_case_run_config
from gate_pipeline.dagster_defs.resources import GateStore
from gate_pipeline.kernel.agents import resolve_agent
from gate_pipeline.kernel.cases import read_cases, write_cases
from gate_pipeline.kernel.engine import Session, play, prepare
from gate_pipeline.kernel.grading import grade_stored
from gate_pipeline.kernel.ledger import last_hash
from gate_pipeline.kernel.settings import Settings
from gate_pipeline.store import RunStore, StoreError, StoreSink, key_id, manifest_body
from gate_pipeline.tables import summary

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
BAD = "eval-amount-bounds-0"  # one defective batch: naive loads it


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GATE_STORE_KEY", raising=False)
    monkeypatch.delenv("GATE_STORE_KEY_FILE", raising=False)
    return tmp_path / "home"


@pytest.fixture
def night(home, tmp_path, capsys):
    """A night of naive and careful on four cases (one of them BAD), played by `gate nightly`."""
    cases = tmp_path / "four.jsonl"
    write_cases(cases, [c for c in read_cases(EVAL) if c.case_id in
                        ("eval-clean-control-0", BAD, "eval-resent-rows-0", "eval-blank-amount-0")])
    assert main(["nightly", "--cases", str(cases), "--agents", "naive,careful"]) == 0
    capsys.readouterr()
    return cases


def db(home) -> sqlite3.Connection:
    return sqlite3.connect(home / "runs.db", isolation_level=None)


def verify(capsys, *args) -> tuple[int, str, str]:
    code = main(["verify", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def episode_of(home, agent: str, case_id: str) -> str:
    return db(home).execute("SELECT episode_id FROM episodes WHERE agent = ? AND case_id = ?",
                            (agent, case_id)).fetchone()[0]


def reseal_everything(home, key_file: Path) -> None:
    """What an attacker who can write GATE_HOME does after editing rows: a key of their own in store.key,
    every episode and manifest sealed again under it, its id recorded."""
    (home / "store.key").write_text(key_file.read_text())
    store = RunStore(Settings(home=home), check_key=False)
    conn = db(home)
    for row in store.episodes():
        conn.execute("UPDATE episodes SET seal = ? WHERE episode_id = ?", (store.seal(row), row["episode_id"]))
    cols = [c[1] for c in conn.execute("PRAGMA table_info(manifests)")]
    for values in conn.execute("SELECT * FROM manifests").fetchall():
        row = dict(zip(cols, values))
        conn.execute("UPDATE manifests SET seal = ? WHERE run_id = ?", (store._manifest_seal(row), row["run_id"]))
    conn.execute("UPDATE gate_store SET value = ? WHERE key = 'key_id'", (key_id(store.key),))
    store.dispose()


def copy_episode(conn, source: str, target: str) -> None:
    """The forger's swap: the source episode's ledger, warehouse and what its row records of them put in the
    target episode (its seal not redone)."""
    conn.execute("DELETE FROM ledger_entries WHERE episode_id = ?", (target,))
    conn.execute("INSERT INTO ledger_entries SELECT ?, seq, entry FROM ledger_entries WHERE episode_id = ?",
                 (target, source))
    conn.execute("UPDATE warehouses SET image = (SELECT image FROM warehouses WHERE episode_id = ?) "
                 "WHERE episode_id = ?", (source, target))
    conn.execute("UPDATE episodes SET (ledger_digest, ledger_entries, warehouse_sha256, end_reason) = (SELECT "
                 "ledger_digest, ledger_entries, warehouse_sha256, end_reason FROM episodes WHERE episode_id = ?) "
                 "WHERE episode_id = ?", (source, target))


def test_the_key_swap_forgery_is_caught(home, night, tmp_path, capsys):
    """Replace the key, copy careful's ledger and warehouse into naive's episode, re-seal every row: the
    store's own checks pass and naive grades 1.0; played again, naive gives another episode."""
    code, out, err = verify(capsys)
    assert code == 0 and "every check holds" in out
    assert err.count("\n") == 1 and "sits beside the database it seals" in err  # the default key: one warning
    original = tmp_path / "original.key"
    original.write_text((home / "store.key").read_text())
    naive, careful = episode_of(home, "naive", BAD), episode_of(home, "careful", BAD)
    conn = db(home)
    before = grade_stored(RunStore().load(naive)).reward
    copy_episode(conn, careful, naive)
    forged_key = tmp_path / "forged.key"
    forged_key.write_text("f" * 64)
    reseal_everything(home, forged_key)
    store = RunStore()
    stored = store.load(naive)
    assert stored.problems == () and grade_stored(stored).reward == 1.0 > before  # the forgery the store let by
    code, out, _ = verify(capsys)
    assert code == 1
    assert f"{naive} {BAD} naive: played again, naive gives another episode" in out
    assert "night 1: the kept summary differs from a fresh one (naive reward: 0.55 kept, 0.6875 fresh)" in out
    # the forger writes the night's summary as the forged episodes give it: only playing naive again is left
    [m] = store.manifests()
    by_slot = {(c, a): e for c, a, _, e in m["episodes"]}
    cases = [store.load(by_slot[(c, "naive")]).case for c in m["body"]["cases"]]
    grades = {a: [grade_stored(store.load(by_slot[(c, a)])) for c in m["body"]["cases"]] for a in ("naive", "careful")}
    forged = {**summary(cases, grades), "cases_file": m["body"]["cases_file"]}
    conn.execute("UPDATE nightly_scores SET summary = ?", (json.dumps(forged),))
    code, out, _ = verify(capsys)
    assert code == 1 and "the kept summary differs" not in out  # (a note says it is unsealed: bare JSON)
    [line] = [line for line in out.splitlines() if BAD in line]
    assert line.startswith(f"{naive} {BAD} naive: played again, naive gives another episode: 4 calls ending on ")
    assert "1 with problems (1 in all)" in out
    # with the key held apart, the swap itself is named, and every seal fails
    code, out, _ = verify(capsys, "--key-file", str(original))
    assert code == 1 and "store: the store key" in out and "is not the key" in out and "seal does not match" in out


def test_an_inserted_grade_and_an_edited_score_are_caught_and_never_published(home, night, capsys):
    def tick(cursor=None):
        with dg.DagsterInstance.ephemeral() as instance:
            context = dg.build_sensor_context(instance=instance, resources={"gate_store": GateStore()}, cursor=cursor)
            data = defs.resolve_sensor_def("grading_sensor").evaluate_tick(context)
        return data

    first = tick()
    assert len(first.asset_events) == 8
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    kept = json.loads(conn.execute("SELECT grade FROM grades WHERE episode_id = ?", (naive,)).fetchone()[0])
    fake = {**kept, "episode_id": "f" * 32, "reward": 1.0}
    conn.execute("INSERT INTO grades (episode_id, case_id, agent, grade, graded_at) VALUES (?, ?, 'naive', ?, 0)",
                 (fake["episode_id"], BAD, json.dumps(fake)))
    conn.execute("UPDATE grades SET grade = ? WHERE episode_id = ?", (json.dumps({**kept, "reward": 1.0}), naive))
    summary = json.loads(conn.execute("SELECT summary FROM nightly_scores").fetchone()[0].partition("\n")[2])
    summary["agents"]["naive"]["reward"] = 1.0
    conn.execute("UPDATE nightly_scores SET summary = ?", (json.dumps(summary),))
    code, out, _ = verify(capsys)
    assert code == 1
    assert f"{'f' * 32} {BAD} naive: a kept grade (row 9) names no stored episode" in out
    assert f"{naive} {BAD} naive: the kept grade differs from a fresh grade in reward" in out
    night_line = next(line for line in out.splitlines() if "night 1" in line)
    assert "the kept summary differs from a fresh one (naive reward: 1.0 kept, 0.55 fresh)" in night_line
    # the sensor: the inserted row is never published; what it publishes it computed
    data = tick(cursor="8")
    assert data.asset_events == [] and data.cursor == "9 · nothing published"
    again = tick()
    rewards = {}
    for e in again.asset_events:  # observation metadata is keyed by the grade's agent
        agent = next(k.split("/")[0] for k in e.metadata if k.endswith("/episode_id"))
        rewards[e.metadata[f"{agent}/episode_id"].value] = e.metadata[f"{agent}/reward"].value
    assert "f" * 32 not in rewards and naive not in rewards and len(rewards) == 7  # the edited row is not published
    tables = [e.metadata["latest_grade_by_agent"].value for e in again.asset_events
              if e.partition == BAD]
    assert tables and all("| naive | 1.0000" not in t for t in tables)


def test_a_deleted_episode_is_caught(home, night, capsys):
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    for table in ("ledger_entries", "warehouses", "episodes"):
        conn.execute(f"DELETE FROM {table} WHERE episode_id = ?", (naive,))
    code, out, _ = verify(capsys)
    assert code == 1 and "7 episodes checked" in out
    assert f"missing: the episode of naive on {BAD} (rollout 0) is not in the store" in out
    assert "night 1: its summary cannot be recomputed" in out


def test_a_night_whose_case_was_altered_is_named_not_recomputed_with_its_summary_edited_or_not(home, night, capsys):
    """A night's summary is recomputed from its episodes' cases: with one of them altered (not parsed), verify gave
    up on the night without a word, and counted it recomputed, so a summary edited as well went unnamed."""
    naive = episode_of(home, "naive", BAD)
    digest = db(home).execute("SELECT case_sha256 FROM episodes WHERE episode_id = ?", (naive,)).fetchone()[0]
    db(home).execute("UPDATE cases SET case_json = replace(case_json, '\"defective\": true', '\"defective\": false') "
                     "WHERE case_sha256 = ?", (digest,))
    code, out, _ = verify(capsys)
    assert code == 1 and "the stored case was altered" in out
    assert f"night 1: its summary cannot be recomputed (the stored case of {BAD} cannot be read: its episodes say " \
           "why)" in out and "nights recomputed 0" in out
    db(home).execute("UPDATE nightly_scores SET summary = replace(summary, '\"reward\": 0.', '\"reward\": 0.9')")
    code, again, _ = verify(capsys)
    assert code == 1 and f"night 1: its summary cannot be recomputed (the stored case of {BAD}" in again


def test_a_sealed_episode_edited_back_to_running_is_named_altered_and_never_closed_as_abandoned(home, night, capsys):
    """Its status set back to 'running', an ended episode read as one that never ended (its seal, which holds
    the status, was not checked): verify called it a process that died, and closing it as abandoned would have
    replaced its grade."""
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    before = conn.execute("SELECT * FROM episodes WHERE episode_id = ?", (naive,)).fetchone()
    conn.execute("UPDATE episodes SET status = 'running' WHERE episode_id = ?", (naive,))
    code, out, _ = verify(capsys)
    assert code == 1 and "the episode's record was altered (it holds what an ended episode records" in out, out
    assert "the episode never ended" not in out, out
    store = RunStore(Settings(home=home), check_key=False)
    try:
        assert store.close_abandoned(naive, "its process died") is False
    finally:
        store.dispose()
    after = conn.execute("SELECT * FROM episodes WHERE episode_id = ?", (naive,)).fetchone()
    assert after == tuple("running" if v == "ended" else v for v in before)  # nothing but the forger's edit


@pytest.mark.parametrize("how", ["abandoned, with the key", "running, its lock held"])
def test_an_episode_a_complete_night_counted_cannot_be_made_abandoned_or_running(home, night, capsys, how):
    """A night completes with what its episodes earned. An episode of it closed as abandoned (its ledger and warehouse
    deleted, its row sealed again with the key beside the database) was never played again, only noted; one set back
    to running with its night's lock held (no key: a running row has no seal) was noted as still being played. Both
    passed verify. An episode a complete run counted is now a problem when it is either."""
    import fcntl
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    for table in ("ledger_entries", "warehouses"):
        conn.execute(f"DELETE FROM {table} WHERE episode_id = ?", (naive,))
    lock = None
    if how.startswith("abandoned"):
        conn.execute("UPDATE episodes SET end_reason = 'abandoned', error = 'its process died', ledger_entries = NULL,"
                     " ledger_digest = NULL, warehouse_sha256 = NULL WHERE episode_id = ?", (naive,))
        store = RunStore(Settings(home=home))
        try:
            conn.execute("UPDATE episodes SET seal = ? WHERE episode_id = ?", (store.seal(store.episode(naive)), naive))
            assert store.load(naive).problems == ()
        finally:
            store.dispose()
        words = "is abandoned"
    else:
        ends = ", ".join(f"{c} = NULL" for c in ("end_reason", "error", "ledger_digest", "ledger_entries", "ended_at",
                                                  "warehouse_sha256", "transcript_sha256", "seal"))
        conn.execute(f"UPDATE episodes SET status = 'running', {ends} WHERE episode_id = ?", (naive,))
        store = RunStore(Settings(home=home), check_key=False)
        try:
            lock_path = store.run_lock(store.episode(naive)["run_id"])
        finally:
            store.dispose()
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "a")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        words = "never ended"
    try:
        code, out, _ = verify(capsys)
    finally:
        if lock is not None:
            lock.close()
    assert code == 1 and f"{naive} {BAD} naive: run " in out and f"counted it when it completed, but it {words}" in out, out


def test_an_api_run_once_completed_names_an_episode_deleted_from_it_or_added_to_it(home, capsys):
    """Episodes stored through the Python API (a StoreSink, no night around them) belong to a run of kind api,
    which lists no episodes while its caller plays it: deleting the episode where an agent failed (its row and
    ledger: no seal to break) went unnoticed. Once the caller completes it (`StoreSink.complete`), the manifest
    lists, sealed, the episodes it holds; a deletion, or an episode stored in it after that, is then named. An
    episode deleted before the caller completes the run is missed by the caller's own record (the sink's), and
    the run is not completed; a night or `gate run` sealed later under the id does not replace a completed run."""
    from gate_pipeline.store import StoreError

    cases = [c for c in read_cases(EVAL) if c.case_id in ("eval-clean-control-0", BAD)]
    store = RunStore()

    def delete(eid):
        conn = db(home)
        for table in ("ledger_entries", "warehouses", "transcripts", "episodes"):
            conn.execute(f"DELETE FROM {table} WHERE episode_id = ?", (eid,))

    early = StoreSink(store)  # deleted before its caller completes the run: the caller's record misses it
    for case in cases:
        play(prepare(case), "naive", sinks=[early], run_id="early-run")
    delete(episode_of(home, "naive", BAD))
    with pytest.raises(StoreError, match=r"run 'early-run': episode \S+ is not in the store \(1 of the 2"):
        early.complete("early-run")

    sink = StoreSink(store, batch=4)
    for case in cases:
        play(prepare(case), "naive", sinks=[sink], run_id="api-run")
    with pytest.raises(StoreError, match="has not ended"):  # the sink keeps them yet: still running in the store
        store.complete_api_run("api-run", [])
    sink.flush()
    failed = db(home).execute("SELECT episode_id FROM episodes WHERE run_id = 'api-run' AND case_id = ?",
                              (BAD,)).fetchone()[0]
    code, out, _ = verify(capsys)
    assert "stored through the Python API and not completed" in out, out
    assert sink.complete("api-run") == 2
    with pytest.raises(StoreError, match="is not an open run"):  # once
        sink.complete("api-run")
    with pytest.raises(StoreError, match="is not an open run"):
        store.complete_api_run("no-such-run", [])
    store.seal_run("api-run", "run", manifest_body(cases, None, [resolve_agent("naive")], 1, "a test"))
    assert store.manifest("api-run")["kind"] == "api"  # a completed run stands
    code, out, _ = verify(capsys, "--json")
    assert not [p for p in json.loads(out)["problems"] if "api-run" in json.dumps(p)], out
    extra = play(prepare(cases[0]), "naive", sinks=[StoreSink(store)], run_id="api-run")
    code, out, _ = verify(capsys)
    assert code == 1 and f"{extra.episode_id} eval-clean-control-0 naive: an episode run api-run's manifest does not list" in out, out
    delete(extra.episode_id)
    delete(failed)
    code, out, _ = verify(capsys)
    assert code == 1 and f"run api-run: missing: episode {failed} of naive on {BAD} (rollout 0) is not in the store" in out, out


def test_a_manifest_names_extra_and_duplicated_episodes(home, capsys):
    cases = read_cases(EVAL)[:2]
    store = RunStore()
    spec_body = manifest_body(cases[:1], None, [resolve_agent("careful")], 1, "a test")
    store.seal_run("r", "run", spec_body)
    sink = StoreSink(store)
    for case in (cases[0], cases[0], cases[1]):  # the first case twice, the second not in the manifest
        play(prepare(case), "careful", sinks=[sink], run_id="r")
    code, out, _ = verify(capsys)
    assert code == 1
    assert f"run r: duplicated: careful on {cases[0].case_id} (rollout 0) was played 2 times" in out
    assert f"{cases[1].case_id} careful: an episode run r's manifest does not list (rollout 0)" in out
    db(home).execute("UPDATE manifests SET body = replace(body, '\"rollouts\": 1', '\"rollouts\": 2')")
    assert "run r: its manifest was altered (its seal does not match)" in verify(capsys)[1]


def forge_case(conn, episode_id: str) -> str:
    """The episode's stored case made to say every batch is clean: kept in `cases` under its own SHA-256, which the
    episode's row is made to name (its seal then fails, until redone with the key). The forged case's hash."""
    digest = conn.execute("SELECT case_sha256 FROM episodes WHERE episode_id = ?", (episode_id,)).fetchone()[0]
    case = json.loads(conn.execute("SELECT case_json FROM cases WHERE case_sha256 = ?", (digest,)).fetchone()[0])
    for batch in case["batches"]:
        batch["truth"] = {"defective": False, "defects": []}
    text = json.dumps(case, sort_keys=True)
    forged = hashlib.sha256(text.encode()).hexdigest()
    conn.execute("INSERT OR REPLACE INTO cases VALUES (?, ?)", (forged, text))
    conn.execute("UPDATE episodes SET case_sha256 = ? WHERE episode_id = ?", (forged, episode_id))
    return forged


def test_the_case_of_an_episode_must_be_the_one_the_run_was_sealed_with(home, night, capsys):
    """The attacker edits the truth labels of naive's stored case (naive is then right) and re-seals the
    episode: played again on the edited case naive gives the same ledger, but the manifest and the case
    file both say the case is another."""
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    forge_case(conn, naive)
    store = RunStore()
    conn.execute("UPDATE episodes SET seal = ? WHERE episode_id = ?", (store.seal(store.episode(naive)), naive))
    assert store.load(naive).problems == ()
    code, out, _ = verify(capsys)
    assert code == 1 and f"{naive} {BAD} naive: its case is not the case run" in out


@pytest.mark.parametrize("agents", ["os:system", "naive,os:system", "subprocess:Popen", "collections:OrderedDict"])
def test_an_agent_name_never_calls_what_it_names(home, tmp_path, capsys, agents):
    marker = tmp_path / "ran"
    options = json.dumps({"os:system": {"command": f"touch {marker}"},
                          "subprocess:Popen": {"args": ["touch", str(marker)]}})
    for command in (["nightly", "--agents", agents, "--agent-options", options], ["report", "--agents", agents]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not an agent (a class that defines play(tools, case=None)); nothing was " \
                                        "called" in err
    assert not marker.exists() and RunStore().episodes() == [] and RunStore().manifests() == []


def test_dagster_run_config_names_only_agents_the_code_location_lists(home, tmp_path):
    marker = tmp_path / "ran"
    with dg.DagsterInstance.ephemeral() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError, match="not in enum type AgentName got os:system"):
            defs.resolve_job_def("nightly_benchmark").execute_in_process(
                instance=instance, run_config=nightly_run_config(str(EVAL), ["os:system"],
                                                                 {"os:system": {"command": f"touch {marker}"}}))
        instance.add_dynamic_partitions("cases", ["eval-clean-control-0"])
        with pytest.raises(dg.DagsterInvalidConfigError, match="got os:system"):
            defs.resolve_job_def("play_case").execute_in_process(
                instance=instance, partition_key="eval-clean-control-0",
                run_config=play_case_run_config("os:system", {"command": f"touch {marker}"}))
        assert instance.get_runs() == []
    assert not marker.exists()


def test_a_listed_name_that_is_no_agent_class_is_refused_before_it_is_called(tmp_path):
    """Even a name the code location lists (GATE_AGENTS=os:system) is checked before anything is called."""
    import subprocess
    import sys
    marker = tmp_path / "ran"
    code = ("import dagster as dg, sys\n"
            "from gate_pipeline.dagster_defs.definitions import defs\n"
            "from gate_pipeline.dagster_defs.jobs import nightly_run_config\n"
            "with dg.DagsterInstance.ephemeral() as i:\n"
            "    r = defs.resolve_job_def('nightly_benchmark').execute_in_process(instance=i, raise_on_error=False,\n"
            f"        run_config=nightly_run_config({str(EVAL)!r}, ['os:system'], "
            f"{{'os:system': {{'command': 'touch {marker}'}}}}))\n"
            "    print([e.event_specific_data.error.message for e in r.all_events if e.is_step_failure][0])\n")
    import os
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "GATE_AGENTS": "os:system", "GATE_HOME": str(tmp_path / "h")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "agent 'os:system': os:system is a builtin_function_or_method, not an agent" in out.stdout
    assert not marker.exists()


@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe" + b"k" * 40, "is not text (it holds bytes that are not UTF-8)"),
    (b"short\n", "is 5 bytes long: a key is 32 to 4,096 bytes of text"),
    ("ключ-из-тридцати-двух-байт".encode()[:31], "bytes"),
    (b"k" * 20 + b"\x00" + b"k" * 20, "holds control characters"),
])
def test_a_key_file_that_is_not_a_key_is_one_line(home, tmp_path, capsys, content, needle):
    home.mkdir(parents=True)
    (home / "store.key").write_bytes(content)
    for command in (["verify"], ["nightly", "--agents", "naive"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and "store key" in err
    key = tmp_path / "elsewhere.key"
    key.write_bytes(content)
    assert main(["verify", "--key-file", str(key)]) == 2
    assert needle in capsys.readouterr().err
    assert main(["verify", "--key-file", str(tmp_path / "missing.key")]) == 2
    assert "missing.key: no such store key file" in capsys.readouterr().err


def test_a_key_of_non_ascii_text_works_and_a_key_from_outside_gate_home_warns_nothing(home, tmp_path, capsys,
                                                                                      monkeypatch):
    key = tmp_path / "outside" / "gate.key"
    key.parent.mkdir()
    key.write_text("ключ, который лежит вне GATE_HOME\n")
    monkeypatch.setenv("GATE_STORE_KEY_FILE", str(key))
    store = RunStore()
    play(prepare(read_cases(EVAL)[0]), "careful", sinks=[StoreSink(store)], run_id="k")
    code, out, err = verify(capsys)
    assert code == 0 and err == "" and "every check holds" in out
    monkeypatch.setenv("GATE_STORE_KEY", "\udcff" * 40)  # not UTF-8: what the environment gives for such bytes
    assert main(["verify"]) == 2 and "GATE_STORE_KEY is not text" in capsys.readouterr().err
    monkeypatch.delenv("GATE_STORE_KEY")
    monkeypatch.delenv("GATE_STORE_KEY_FILE")  # the default key now: another key than the store was sealed with
    assert main(["nightly", "--agents", "naive"]) == 2
    assert "is not the key" in capsys.readouterr().err


def test_a_key_beside_the_database_that_links_elsewhere_still_warns(home, tmp_path, capsys):
    """Whoever can write GATE_HOME replaced store.key with a link to a key of their own outside it, which silenced
    the warning that the key sits beside the database: the link is in the folder, and is replaced as easily."""
    store = RunStore()
    play(prepare(read_cases(EVAL)[0]), "naive", sinks=[StoreSink(store)], run_id="k")
    store.dispose()
    elsewhere = tmp_path / "elsewhere.key"
    elsewhere.write_text((home / "store.key").read_text())
    (home / "store.key").unlink()
    (home / "store.key").symlink_to(elsewhere)
    code, out, err = verify(capsys)
    assert code == 0 and "sits beside the database it seals" in err, (out, err)


def test_a_key_beside_a_database_that_is_a_link_still_warns(home, tmp_path, capsys):
    """runs.db in GATE_HOME a link to a database elsewhere, the key still in GATE_HOME: no warning, as the database's
    folder was judged by where the link leads. Whoever can write GATE_HOME can swap the key and point the link at a
    store sealed with it."""
    store = RunStore()
    play(prepare(read_cases(EVAL)[0]), "naive", sinks=[StoreSink(store)], run_id="k")
    store.dispose()
    volume = tmp_path / "volume"
    volume.mkdir()
    (home / "runs.db").rename(volume / "runs.db")
    (home / "runs.db").symlink_to(volume / "runs.db")
    code, out, err = verify(capsys)
    assert code == 0 and "sits beside the database it seals" in err, (out, err)


def test_refused_calls_keep_a_bounded_preview(home):
    """300 refused quarantine_rows calls of 1,000 keys of 200 characters each: a bounded ledger."""
    v2 = read_cases(ROOT / "cases" / "v2" / "eval_curated.jsonl")[0]
    store = RunStore()
    session = Session(prepare(v2), "flood", sinks=[StoreSink(store)])
    keys = [f"{n:0200d}" for n in range(1000)]
    for _ in range(300):
        result = session.call("quarantine_rows", {"batch_id": "nope", "keys": keys, "column": "amount",
                                                  "defect_type": "out_of_range"})
        assert "error" in result
    session.finish()
    sizes = [len(json.dumps(e)) for e in store.entries(session.episode_id)]
    assert len(sizes) == 300 and max(sizes) < 6_000  # was 204 KB each
    assert (home / "runs.db").stat().st_size < 8_000_000  # was 124 MB
    entry = store.entries(session.episode_id)[0]
    assert entry["args"]["keys"][-1] == "...[1,000 items]" and len(entry["args"]["keys"]) == 21
    assert last_hash(store.entries(session.episode_id)) == store.episode(session.episode_id)["ledger_digest"]


def test_a_model_episode_is_tied_to_its_transcript(home, tmp_path, capsys):
    """A model cannot be played again: its ledger must be the tool calls its transcript's messages made. An
    attacker with the key who rewrites one call in the stored transcript (or the transcript file) is named."""
    from scripted_server import ScriptedServer
    with ScriptedServer() as server:
        assert main(["run", "--model", "scripted", "--base-url", server.url, "-n", "2", "--run-id", "m",
                     "--runs-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
    assert code == 0 and "tied to a transcript 2," in out
    store = RunStore()
    [first, second] = store.episodes(run_id="m")
    log = store.transcript(first["episode_id"])
    call = next(tc for m in log["messages"] if m.get("role") == "assistant" for tc in m.get("tool_calls", [])
                if tc["function"]["name"] == "run_sql")
    call["function"]["arguments"] = json.dumps({"query": "SELECT 1"})
    text = json.dumps(log, sort_keys=True, default=str)
    import hashlib
    conn = db(home)
    conn.execute("UPDATE transcripts SET log = ? WHERE episode_id = ?", (text, first["episode_id"]))
    conn.execute("UPDATE episodes SET transcript_sha256 = ? WHERE episode_id = ?",
                 (hashlib.sha256(text.encode()).hexdigest(), first["episode_id"]))
    row = store.episode(first["episode_id"])
    conn.execute("UPDATE episodes SET seal = ? WHERE episode_id = ?", (store.seal(row), first["episode_id"]))
    assert store.load(first["episode_id"]).problems == ()
    code, out, _ = verify(capsys)
    assert code == 1 and f"{first['episode_id']} {first['case_id']} scripted: tool call" in out
    assert "gives another result than the one the transcript says the model was sent" in out
    # a line of the transcript file that is not the stored one, or a stored episode with no line
    path = tmp_path / "m" / "transcripts.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    kept = next(line for line in lines if line["episode_id"] == second["episode_id"])  # lines are in order of ending
    kept["ledger"] = kept["ledger"][:-1]
    path.write_text(json.dumps(kept) + "\n")
    code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
    assert code == 1 and f"{second['episode_id']} {second['case_id']} scripted: the transcript line's ledger is not " \
                         f"the stored ledger" in out
    assert f"{first['episode_id']} {first['case_id']} scripted: the episode has no line in transcripts.jsonl" in out


def test_a_transcript_line_claims_only_what_the_store_holds(home, tmp_path, capsys):
    """Without the key: a transcript line whose top-level reward, end or case was raised was never compared, and a
    grade `{"unreadable": true, "reason": ""}` (or a reason that is not text: a traceback) switched the grade's
    comparison off, so `gate verify --run` passed a file claiming every rollout passed; and the reason such a grade
    gives was printed as the problem, the forger's words in verify's mouth."""
    from scripted_server import ScriptedServer
    with ScriptedServer() as server:
        assert main(["run", "--model", "scripted", "--base-url", server.url, "-n", "3", "--run-id", "m",
                     "--runs-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    path = tmp_path / "m" / "transcripts.jsonl"
    honest = path.read_text()
    assert verify(capsys, "--run", str(tmp_path / "m"))[0] == 0
    edits = [("reward", 0.5), ("finished", False), ("end_reason", "no_report"), ("error", "x"), ("case_id", "other"),
             ("model", "other"), ("rollout", 7), ("run_id", "other"), ("key", "other#0"), ("family", "other")]
    for key, value in edits:
        lines = [json.loads(line) for line in honest.splitlines()]
        lines[0][key] = value
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
        assert code == 1 and f"the transcript line says {key} " in out, (key, out)
    for key, value in (("revenue", 1.5), ("correct_revenue", 1.5), ("suite", "v2"), ("a\nmetric", 1),
                       ("reason", "x"), ("family", "other")):  # the rest of the grade, beside its reward
        lines = [json.loads(line) for line in honest.splitlines()]
        lines[0]["grade"][key] = value
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
        named = "keys a grade has not" if "\n" in key else key  # a key of the line's own is not printed
        assert code == 1 and f"the transcript line differs from a fresh grade in {named}" in out, (key, out)
    for key, value in (("turns", 99), ("counts", {"run_sql": 99}), ("usage", {"total_tokens": 1}),
                       ("tool_calls", []), ("settings", {"temperature": 9})):  # what the model's side says
        lines = [json.loads(line) for line in honest.splitlines()]
        lines[0][key] = value
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
        assert code == 1 and f"the transcript line's {key} are not the stored ones" in out, (key, out)
    for reason in ("", None, 0, float("nan"), 5, "a line forged to read well"):
        lines = [json.loads(line) for line in honest.splitlines()]
        lines[1]["grade"] = {"unreadable": True, "reason": reason}
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        for flags in ((), ("--json",)):
            code, out, _ = verify(capsys, "--run", str(tmp_path / "m"), *flags)
            assert code == 1 and "the transcript line is not readable" in out, (reason, out)
            assert "forged" not in out, out  # verify says what is wrong in its own words, not the line's
    for eid in ([honest.split('"episode_id": "', 1)[1].split('"', 1)[0]], {"x": 1}):  # no id is a list: it
        lines = [json.loads(line) for line in honest.splitlines()]                  # raised a traceback
        lines[0]["episode_id"] = eid
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
        assert code == 1 and "its 'episode_id' is not text" in out, (eid, out)


def test_a_whole_grade_is_compared_by_its_json_even_where_a_value_equals_nothing():
    """A grade's value that is not equal to itself (a NaN: an authored case's infinite revenue) is the same
    value in the transcript line gate wrote for it; any other change of the line's grade is still named."""
    from gate_pipeline.kernel.records import Grade
    from gate_pipeline.verify import differs

    fresh = Grade(case_id="c", family="f", disposition=1.0, report=1.0, evidence=1.0, inspected=1.0, reward=1.0,
                  bad_batches_loaded=0, clean_batches_refused=0, revenue_error_usd=0.0, ledger_intact=True,
                  finished=True, revenue=float("nan"), correct_revenue=float("inf"), metrics={"m": float("nan")})
    written = json.loads(json.dumps(fresh.as_dict()))
    assert differs(written, fresh, whole=True) is None
    assert differs(written, fresh) is None
    for key, value in (("revenue", 1.0), ("correct_revenue", 1e308), ("m", 0), ("suite", "v2")):
        assert differs({**written, key: value}, fresh, whole=True) == \
            f"the kept grade differs from a fresh grade in {key}", key
        assert differs({**written, key: value}, fresh) is None, key  # not a rubric key: a store row's is not read
    assert differs({**written, "extra": 1}, fresh, whole=True) == \
        "the kept grade differs from a fresh grade in keys a grade has not"


@pytest.mark.parametrize("reason", ["", None, 5, "a row forged to read well"])
def test_a_kept_grade_saying_it_is_unreadable_is_a_problem_whatever_its_reason(home, night, capsys, reason):
    """Without the key: a kept grade row `{"unreadable": true, "reason": ""}` read as no difference at all, and a
    reason in words was printed as verify's own."""
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_sensor_context(instance=instance, resources={"gate_store": GateStore()})
        assert len(defs.resolve_sensor_def("grading_sensor").evaluate_tick(context).asset_events) == 8
    naive = episode_of(home, "naive", BAD)
    db(home).execute("UPDATE grades SET grade = ? WHERE episode_id = ?",
                     (json.dumps({"unreadable": True, "reason": reason}), naive))
    code, out, _ = verify(capsys)
    assert code == 1 and f"{naive} {BAD} naive: the kept grade is not readable" in out, out
    assert "forged" not in out, out


def test_deleting_the_manifests_does_not_make_a_night_or_its_episodes_unchecked(home, night, capsys):
    """Without the key: delete every manifest, raise the night's summary and delete an episode. A night whose
    run has no manifest, and episodes that claim a run with none, are failures: only a store whose episodes
    were stored before gate sealed runs (no agent name, under a seal that holds) may say it predates them."""
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    conn.execute("DELETE FROM manifests")
    kept = json.loads(conn.execute("SELECT summary FROM nightly_scores").fetchone()[0].partition("\n")[2])
    kept["agents"]["naive"]["reward"] = 0.99
    conn.execute("UPDATE nightly_scores SET summary = ?", (json.dumps(kept),))
    for table in ("ledger_entries", "warehouses", "episodes"):
        conn.execute(f"DELETE FROM {table} WHERE episode_id = ?", (naive,))
    code, out, _ = verify(capsys)
    assert code == 1 and "predates" not in out and "belong to no sealed run" not in out
    assert "night 1: its run has no manifest (every night gate plays seals one)" in out
    assert out.count("has no manifest (every run gate stores seals one") == 7
    assert "7 episodes checked" in out and "8 with problems (8 in all)" in out


@pytest.mark.parametrize("edit", ["name", "options", "manifest"])
def test_an_episode_plays_the_agent_its_run_was_sealed_with(home, night, tmp_path, capsys, edit):
    """With the key: careful's ledger and warehouse in naive's episode, its agent renamed to one gate does not
    know (or given options naive does not take), everything re-sealed. The manifest's agent (its name, its
    options) is the one played again; one it marks deterministic that cannot be played again is a failure."""
    naive, careful = episode_of(home, "naive", BAD), episode_of(home, "careful", BAD)
    conn = db(home)
    copy_episode(conn, careful, naive)
    if edit == "options":
        conn.execute("UPDATE episodes SET agent_options = ? WHERE episode_id = ?", (json.dumps({"nope": 1}), naive))
    else:
        conn.execute("UPDATE episodes SET agent_name = 'zzz' WHERE episode_id = ?", (naive,))
    if edit == "manifest":  # the forger names 'zzz' in the manifest too: it says naive is deterministic
        body = json.loads(conn.execute("SELECT body FROM manifests").fetchone()[0])
        body["agents"] = [{**a, "name": "zzz"} if a["identity"] == "naive" else a for a in body["agents"]]
        conn.execute("UPDATE manifests SET body = ?", (json.dumps(body, sort_keys=True),))
    reseal_everything(home, home / "store.key")
    code, out, _ = verify(capsys)
    assert code == 1 and "not played again" not in out, out
    lines = [line for line in out.splitlines() if line.startswith(f"{naive} {BAD} naive: ")]
    if edit == "name":
        assert "its agent is 'zzz' with options {}, but run" in lines[0] and "sealed with 'naive'" in lines[0]
    elif edit == "options":
        assert "its agent is 'naive' with options {\"nope\": 1}, but run" in lines[0]
        assert "sealed with 'naive' with options {} for 'naive'" in lines[0]
    else:
        assert lines[0].startswith(f"{naive} {BAD} naive: its agent 'zzz' cannot be played again here (unknown agent")
        assert lines[0].endswith("but it plays as 'naive', an agent gate plays again")
    if edit != "manifest":  # the manifest's agent is played again: the swapped ledger is named too
        assert "played again, naive gives another episode" in lines[1]


def set_manifest(home, column: str, value) -> None:
    db(home).execute(f"UPDATE manifests SET {column} = ?", (value if isinstance(value, str) else json.dumps(value),))


def with_body(home, **fields) -> dict:
    body = json.loads(db(home).execute("SELECT body FROM manifests").fetchone()[0])
    return {**body, **fields}


@pytest.mark.parametrize("body", [{"cases_file": None}, {"cases_file_sha256": None}])
def test_a_manifest_naming_no_case_file_says_its_case_file_is_not_checked(home, night, tmp_path, capsys, body):
    """With the key: a manifest whose case file was set to null (so a case swapped in the store and sealed again
    went unchecked against the file) passed without a word, where the docs say the check is noted as skipped."""
    set_manifest(home, "body", with_body(home, **body))
    key = tmp_path / "own.key"
    key.write_text((home / "store.key").read_text())
    reseal_everything(home, key)
    code, out, _ = verify(capsys)
    assert "note: run " in out and "its case file" in out and "is not checked (" in out, out


HOSTILE_MANIFESTS = {  # what an edit without the key can make of a manifest row: each must be one line
    "episodes an int": ("episodes", lambda home: "5", "its episodes are not a list"),
    "episodes unhashable": ("episodes", lambda home: [[[1], "naive", 0, "x"]], "its episodes are not a list"),
    "cases unhashable": ("body", lambda home: with_body(home, cases=[[1]]), "its cases are not a list of case ids"),
    "identity unhashable": ("body", lambda home: with_body(home, agents=[{"identity": [1]}]), "its agents are not"),
    "agents an int": ("body", lambda home: with_body(home, agents=5), "its agents are not"),
    "cases_file an int": ("body", lambda home: with_body(home, cases_file=5), "its cases_file is not text"),
    "cases_file a list": ("body", lambda home: with_body(home, cases_file=[1]), "its cases_file is not text"),
    "rollouts 10**12": ("body", lambda home: with_body(home, rollouts=10**12), "its rollouts are not a count"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_MANIFESTS))
def test_a_hostile_manifest_row_is_one_line_never_a_traceback_or_a_hang(home, night, name):
    """No key needed: a manifest row edited into any JSON is named unreadable, in one line, and verify ends."""
    import resource
    import subprocess
    import sys
    column, value, needle = HOSTILE_MANIFESTS[name]
    set_manifest(home, column, value(home))

    def limit():  # a run of range(10**12) ends in a MemoryError, not in swapping the machine
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    p = subprocess.run([sys.executable, "-m", "gate_pipeline.cli.main", "verify"], capture_output=True, text=True,
                       timeout=120, preexec_fn=limit)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "run " in p.stdout and f"its manifest is not readable ({needle}" in p.stdout


def test_a_continuation_of_no_run_is_one_line(home, night, capsys):
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    conn.execute("INSERT INTO manifests VALUES ('cont', 'continuation', ?, 'open', NULL, 0, NULL, 'x')",
                 (json.dumps({"of": [1]}),))
    conn.execute("UPDATE episodes SET run_id = 'cont' WHERE episode_id = ?", (naive,))
    code, out, _ = verify(capsys)
    assert code == 1 and "run cont: its manifest is not readable (it continues no run" in out
    assert f"{naive} {BAD} naive: its run cont has no manifest" in out


@pytest.mark.parametrize("kept", ['{"agents": [1]}', "{{{", '{"agents": {"naive": {"reward": "x"}}}', "[1]"])
def test_a_corrupt_kept_summary_is_skipped_by_the_nightly_and_named_by_verify(home, night, capsys, kept):
    """Nightly summaries are caches: one that does not parse, or is not a summary, never stops a night."""
    db(home).execute("UPDATE nightly_scores SET summary = ?", (kept,))
    assert RunStore().nightly_history() == []
    assert main(["nightly", "--cases", str(night), "--agents", "naive,careful"]) == 0
    out = capsys.readouterr().out
    assert "nightly history (mean reward):\n  night    2  four.jsonl  careful 1.0000  naive 0.5500\n" in out
    assert "night    1" not in out
    code, out, _ = verify(capsys)
    assert code == 1 and "night 1: the kept summary differs from a fresh one" in out and "night 2" not in out


def test_a_stored_id_cannot_forge_a_line_of_verify(home, night, capsys):
    """A case id edited in the store to hold a newline and a fake verdict printed that verdict as a line of its own
    (no key needed); every line verify prints now holds its stored text with control characters escaped."""
    naive = episode_of(home, "naive", BAD)
    db(home).execute("UPDATE episodes SET case_id = ? WHERE episode_id = ?",
                     (f"{BAD}\n8 episodes checked: every check holds\x1b[2J", naive))
    code, out, _ = verify(capsys)
    assert code == 1 and "\x1b" not in out
    assert not any(line.startswith("8 episodes checked: every check holds") for line in out.splitlines())
    assert f"{BAD}\\n8 episodes checked: every check holds\\x1b[2J" in out


@pytest.mark.parametrize("column", ["case_id", "agent"])
def test_a_stored_id_of_bytes_is_text_in_verify_json_never_a_traceback(home, night, capsys, column):
    """No key needed: an id edited into a BLOB was said in verify's lines but raised a TypeError traceback with
    --json (bytes are no JSON). Every field of a problem is text."""
    naive = episode_of(home, "naive", BAD)
    db(home).execute(f"UPDATE episodes SET {column} = X'00ff41' WHERE episode_id = ?", (naive,))
    code, out, _ = verify(capsys, "--json")
    assert code == 1
    problems = json.loads(out)["problems"]
    assert problems and all(isinstance(v, str) for p in problems for v in p.values())
    assert any(p["episode_id"] == naive and "\\x00\\xffA" in p[column] for p in problems), problems


def _returns_within(fn, seconds: float = 10.0):
    """fn()'s value, or a failure when it has not returned within `seconds` (a FIFO once made a lock wait for ever)."""
    import threading
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - raised again on the test's thread
            out["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "did not return: it waits"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_lock_path_that_is_no_regular_file_holds_no_lock_and_never_makes_gate_wait(tmp_path):
    """Planted where a run's lock goes, a socket made a fake running episode read as being played (verify passed
    it); a FIFO made verify, `gate run` and `gate nightly` wait for ever."""
    import fcntl
    import os
    import socket

    from gate_pipeline.store import StoreError, hold_lock, lock_free
    fifo, sock, link, missing, plain = (tmp_path / n for n in ("fifo.lock", "sock.lock", "link.lock", "no.lock",
                                                               "plain.lock"))
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    link.symlink_to(fifo)
    plain.write_text("")
    try:
        for path in (fifo, sock, link):
            assert _returns_within(lambda p=path: lock_free(p)) is True  # no process of gate's can hold it
            with pytest.raises(StoreError, match="cannot use it as a lock file"):
                _returns_within(lambda p=path: hold_lock(p, "me").__enter__())
        assert lock_free(missing) is False and lock_free(plain) is True
        with open(plain) as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            assert lock_free(plain) is False
        with hold_lock(tmp_path / "made.lock", "me"):
            assert (tmp_path / "made.lock").read_text() == "me" and not lock_free(tmp_path / "made.lock")
        assert lock_free(tmp_path / "made.lock")
    finally:
        server.close()


def test_a_nights_summary_deleted_or_kept_twice_is_caught(home, night, capsys):
    """Summaries are caches, recomputed one by one; nothing tied them to their nights, so a night's deleted, or
    another's copied over it (its run id and figures), or a copy kept as a later night passed `gate verify`."""
    conn = db(home)
    [(run_id, text)] = conn.execute("SELECT run_id, summary FROM nightly_scores").fetchall()
    conn.execute("INSERT INTO nightly_scores (run_id, at, summary) VALUES (?, 0, ?)", (run_id, text))
    code, out, _ = verify(capsys)
    assert code == 1 and f"run {run_id}: nights 1, 2 are all kept as this run's summary: a run keeps one" in out
    conn.execute("DELETE FROM nightly_scores")
    code, out, _ = verify(capsys)
    assert code == 1 and f"run {run_id}: a complete night with no kept summary" in out
    conn.execute("INSERT INTO nightly_scores (run_id, at, summary) VALUES (?, 0, ?)", (run_id, text))
    assert verify(capsys)[0] == 0  # the one summary back: every check holds


@pytest.mark.parametrize("column", ["agent", "run_id", "agent_options", "warehouse", "seal"])
def test_a_sealed_text_edited_into_bytes_is_an_altered_row_not_a_traceback(home, night, capsys, column):
    """SQLite keeps whatever type a column is given: a BLOB in a text column came back as bytes, and sealing
    it (JSON) or comparing it with a seal raised TypeError out of `gate verify`."""
    naive = episode_of(home, "naive", BAD)
    db(home).execute(f"UPDATE episodes SET {column} = CAST({column} AS BLOB) WHERE episode_id = ?", (naive,))
    code, out, err = verify(capsys)
    assert code == 1 and "Traceback" not in err
    assert f"{naive} " in out and "the episode's record was altered (its seal does not match)" in out


def test_what_fails_its_checks_is_not_rebuilt_played_again_or_expanded(home, night, capsys):
    """Rebuilding an episode from a broken ledger, or expanding a manifest whose seal fails, could be made to
    take any time (a hundred thousand slow queries; rollouts x cases x agents of any size): neither is done."""
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    [(last,)] = conn.execute("SELECT max(seq) FROM ledger_entries WHERE episode_id = ?", (naive,)).fetchall()
    slow = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r"
    conn.executemany("INSERT INTO ledger_entries VALUES (?, ?, ?)", [
        (naive, last + k, json.dumps({"action": "run_sql", "args": {"query": slow, "tables_read": []}, "executed": True,
                                      "hash": "x", "note": "", "prev_hash": "x", "seq": last + k}))
        for k in range(1, 6)])
    body = {"agents": [{"name": "naive", "identity": "naive", "options": {}, "deterministic": True}],
            "cases": [f"c{k}" for k in range(100)], "case_sha256": {}, "rollouts": 10**5, "gate_version": "0",
            "process": "x", "cases_file": None, "cases_file_sha256": None}
    conn.execute("INSERT INTO manifests (run_id, kind, body, status, episodes, created_at, seal) VALUES "
                 "('forged', 'run', ?, 'open', NULL, 0, 'f00')", (json.dumps(body),))
    code, out, _ = verify(capsys)
    assert code == 1 and f"{naive} {BAD} naive: the ledger's hash chain is broken" in out
    assert f"note: {naive} {BAD} naive: not rebuilt or played again: its record, case or ledger failed" in out
    assert "warehouses rebuilt 7;" in out  # the night's eight but the broken one
    assert "run forged: its manifest was altered (its seal does not match)" in out
    assert "run forged: missing" not in out and len(out.splitlines()) < 40  # its 10**7 slots never listed


def test_gate_never_seals_again_a_run_or_episode_whose_seal_failed(home, night, capsys):
    """Closing a dead run sealed its manifest again without checking the seal it had: a forger who reopened a
    night's manifest, deleted an episode and its summary, and left a free lock beside it had the next routine
    `gate nightly` (or the grading sensor, every 15 s) vouch for the edit, and `gate verify` then said every
    check holds."""
    [run_id] = [r[0] for r in db(home).execute("SELECT run_id FROM manifests")]
    naive = episode_of(home, "naive", BAD)
    conn = db(home)
    conn.execute("UPDATE manifests SET status = 'open', episodes = NULL")
    for table in ("episodes", "ledger_entries", "warehouses"):
        conn.execute(f"DELETE FROM {table} WHERE episode_id = ?", (naive,))
    conn.execute("DELETE FROM nightly_scores")
    (home / "locks").mkdir(exist_ok=True)
    (home / "locks" / f"{run_id}.lock").touch()  # free: its process looks dead
    code, out, _ = verify(capsys)
    assert code == 1 and "its manifest was altered (its seal does not match)" in out, out
    before = conn.execute("SELECT * FROM manifests").fetchall()
    store = RunStore(Settings(home=home))
    try:
        assert store.close_dead_runs() == []
        assert conn.execute("SELECT * FROM manifests").fetchall() == before  # left as the forger made it
    finally:
        store.dispose()
    code, out, _ = verify(capsys)
    assert code == 1 and "its manifest was altered (its seal does not match)" in out, out


def test_a_step_output_is_read_only_as_its_step_kept_it(home):
    """The nightly's step outputs (the plan, each chunk's grades, the scoreboard) were read back as stored: a grade
    edited in a chunk's output was the re-executed night's scoreboard and regression line, and a plan edited to
    name `this:Nope` made the run worker import `this`. Each is sealed now with the run, step and output it is."""
    import dagster as dg

    from gate_pipeline.dagster_defs.resources import StepOutputs
    store = RunStore(Settings(home=home))
    try:
        store.put_output("run-1", "scoreboard.plan_nightly", "plan", '{"agents": ["naive"]}')
        store.put_output("run-1", "scoreboard.plan_nightly", "chunks[cases_0000]", '{"agents": ["naive"]}')
        assert store.get_output("run-1", "scoreboard.plan_nightly", "plan") == '{"agents": ["naive"]}'
        assert store.get_output("run-1", "scoreboard.plan_nightly", "missing") is None
        conn = db(home)
        for edit in ("UPDATE step_outputs SET value = replace(value, 'naive', 'this:Nope') WHERE output = 'plan'",
                     "UPDATE step_outputs SET value = '{\"agents\": [\"this:Nope\"]}' WHERE output = 'plan'",  # unsealed
                     "UPDATE step_outputs SET value = (SELECT value FROM step_outputs WHERE output <> 'plan') "
                     "WHERE output = 'plan'",  # another output's, sealed
                     "UPDATE step_outputs SET value = CAST(value AS BLOB) WHERE output = 'plan'"):
            store.put_output("run-1", "scoreboard.plan_nightly", "plan", '{"agents": ["naive"]}')
            conn.execute(edit)
            with pytest.raises(StoreError, match="'plan' of step 'scoreboard.plan_nightly' in run run-1: its seal does "
                                                 "not match"):
                store.get_output("run-1", "scoreboard.plan_nightly", "plan")
        manager = StepOutputs(GateStore())
        context = dg.build_input_context(upstream_output=dg.build_output_context(
            run_id="run-1", step_key="scoreboard.plan_nightly", name="plan"))
        with pytest.raises(dg.Failure, match="its seal does not match"):
            manager.load_input(context)
    finally:
        store.dispose()


@pytest.mark.parametrize("sealed", [True, False])
def test_an_edited_summary_is_never_the_regression_lines_or_the_historys(home, night, capsys, sealed):
    """The regression line compared tonight with the previous night's kept summary as stored: raised to 0.95, it
    reported naive falling 0.9500 -> 0.5500, and the history showed the raised figure. A kept summary is sealed
    with its run now; one edited (under its old seal, or as bare JSON) is neither compared with nor shown."""
    conn = db(home)
    text = conn.execute("SELECT summary FROM nightly_scores").fetchone()[0]
    seal, _, body = text.partition("\n")
    kept = json.loads(body)
    kept["agents"]["naive"]["reward"] = 0.95
    edited = json.dumps(kept, sort_keys=True)
    conn.execute("UPDATE nightly_scores SET summary = ?", (f"{seal}\n{edited}" if sealed else edited,))
    assert RunStore().nightly_history() == []
    assert main(["nightly", "--cases", str(night), "--agents", "naive,careful"]) == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "0.9500" not in out, out
    assert "nightly history (mean reward):\n  night    2  four.jsonl  careful 1.0000  naive 0.5500\n" in out
    code, out, _ = verify(capsys)
    assert code == 1 and "night 1: the kept summary differs from a fresh one (naive reward: 0.95 kept, 0.55 fresh)" in out


def test_a_nights_summary_is_kept_only_with_the_manifest_it_completes(home, night):
    """complete_night kept a sealed summary even when the manifest could not be completed (complete already: two
    re-executions racing; altered; missing), so the history believed a second summary of one night. Now neither
    is kept, and the step fails saying why."""
    [run_id] = [r[0] for r in db(home).execute("SELECT run_id FROM manifests")]
    store = RunStore(Settings(home=home))
    try:
        before = store.nights()
        for night_id in (run_id, "no-such-night"):
            with pytest.raises(StoreError, match="the night is not completed, and its summary not kept"):
                store.complete_night(night_id, [], {"agents": {"naive": {"reward": 1.0}}}, "re-execution")
        assert store.nights() == before
    finally:
        store.dispose()


def test_verify_names_a_summary_whose_seal_does_not_hold(home, night, capsys):
    """A kept summary whose figures are right but whose seal does not hold (its seal line edited, or kept by an older
    gate as bare JSON) is skipped by the history; verify says so, as a note, instead of passing over it in silence."""
    conn = db(home)
    text = conn.execute("SELECT summary FROM nightly_scores").fetchone()[0]
    _, _, body = text.partition("\n")
    code, out, _ = verify(capsys)
    assert code == 0 and "not sealed with its run" not in out, out
    for kept in (f"{'0' * 64}\n{body}", body):
        conn.execute("UPDATE nightly_scores SET summary = ?", (kept,))
        assert RunStore().nightly_history() == []
        code, out, _ = verify(capsys)
        assert code == 0 and "night 1: its kept summary is not sealed with its run" in out, out


@pytest.mark.parametrize("edit, said", [
    ("UPDATE episodes SET error = CAST('x' AS BLOB) WHERE episode_id = :e", "the episode's record was altered"),
    ("UPDATE warehouses SET image = 7 WHERE episode_id = :e", "was altered (its SHA-256 differs"),
    ("UPDATE episodes SET status = 'running', end_reason = NULL, error = NULL, ledger_digest = NULL, "
     "ledger_entries = NULL, ended_at = NULL, warehouse_sha256 = NULL, transcript_sha256 = NULL, seal = NULL, "
     "run_id = CAST(run_id AS BLOB) WHERE episode_id = :e", "never ended"),
])
def test_a_column_edited_into_another_type_is_named_not_a_traceback(home, night, capsys, edit, said):
    """Without the key: an episode's error edited into a BLOB, its warehouse image into a number, or its run id into
    a BLOB with the episode set back to running (a running row carries no seal) each stopped verify with a
    traceback, where a row edited into another type is an altered row."""
    naive = episode_of(home, "naive", BAD)
    db(home).execute(edit, {"e": naive})
    code, out, err = verify(capsys)
    assert code == 1 and f"{naive} {BAD} naive: " in out and said in out and "Traceback" not in err, (out, err)


def test_a_case_the_case_file_spells_otherwise_fails_whatever_the_manifest_says_of_the_file(home, night, capsys):
    """With the key: BAD's stored case made to say its defective batch is clean (so naive, loading it, scored higher),
    its hashes and seals redone, and the manifest's hash of the case file changed, which made the file's check a
    note only ("changed since the run was sealed"). The file, outside GATE_HOME, still says otherwise."""
    conn = db(home)
    body = json.loads(conn.execute("SELECT body FROM manifests").fetchone()[0])
    for (eid,) in conn.execute("SELECT episode_id FROM episodes WHERE case_id = ?", (BAD,)).fetchall():
        body["case_sha256"][BAD] = forge_case(conn, eid)
    body["cases_file_sha256"] = "0" * 64
    conn.execute("UPDATE manifests SET body = ?", (json.dumps(body, sort_keys=True),))
    reseal_everything(home, home / "store.key")
    code, out, _ = verify(capsys)
    assert code == 1 and f"{BAD} naive: its case is not the one in the case file" in out, out
    assert "changed since the run was sealed: its episodes' cases are checked against the cases it still holds" in out


def test_a_model_named_after_an_agent_gate_plays_again_is_refused_and_never_passes_verify(home, night, capsys,
                                                                                          tmp_path):
    """With the key: naive's episode given careful's ledger and warehouse, its agent made the model agent with the
    model 'naive' (so it is named 'naive' everywhere, and a model is never played again), manifest and all re-sealed:
    verify tied it to its transcript and passed it. No agent may take another agent's name now, so such an episode
    is one that gate could not have played, and verify says so."""
    from gate_pipeline.kernel.errors import AgentOptionError
    with pytest.raises(AgentOptionError, match="the name of another agent gate knows"):
        resolve_agent("model", {"model": "naive", "base_url": "http://127.0.0.1:9/v1"})
    assert main(["run", "--model", "careful", "--base-url", "http://127.0.0.1:9/v1", "--runs-dir",
                 str(tmp_path / "runs")]) == 2
    assert "the name of another agent gate knows" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before its run's directory was made
    naive, careful = episode_of(home, "naive", BAD), episode_of(home, "careful", BAD)
    conn = db(home)
    copy_episode(conn, careful, naive)
    options = {"model": "naive", "base_url": "http://127.0.0.1:9/v1"}
    conn.execute("UPDATE episodes SET agent_name = 'model', agent_options = ? WHERE episode_id = ?",
                 (json.dumps(options, sort_keys=True), naive))
    body = json.loads(conn.execute("SELECT body FROM manifests").fetchone()[0])
    body["agents"] = [{**a, "name": "model", "options": options, "deterministic": False} if a["identity"] == "naive"
                      else a for a in body["agents"]]
    conn.execute("UPDATE manifests SET body = ?", (json.dumps(body, sort_keys=True),))
    reseal_everything(home, home / "store.key")
    code, out, _ = verify(capsys)
    line = next(line for line in out.splitlines() if line.startswith(f"{naive} {BAD} naive: "))
    assert code == 1 and "its agent 'model' cannot be played again here" in line, out
    assert line.endswith("but it plays as 'naive', an agent gate plays again"), line


@pytest.mark.parametrize("model", ["Naive", "CAREFUL", "naive ", " naive", "naive\u200b", "\uff4e\uff41\uff49\uff56\uff45",
                                   "careful@full", "careful@anything", "gate_pipeline.agents.baselines:Naive"])
def test_a_model_whose_name_reads_as_another_agents_is_refused(model):
    """Not only the very name: its case, spaces, an invisible or full-width character, a variant of the agent, or a
    class gate would import by that name, each read as another agent's in a table, and `careful@full` is one gate
    plays again."""
    from gate_pipeline.kernel.errors import AgentOptionError
    with pytest.raises(AgentOptionError, match="the name of another agent gate knows"):
        resolve_agent("model", {"model": model, "base_url": "http://127.0.0.1:9/v1"})


@pytest.mark.parametrize("model", ["gpt-4o", "llama3:8b", "mistral:latest", "qwen2.5:7b", "Qwen/Qwen2.5-7B-Instruct",
                                   "scripted", "naive-finetune", "openai:o3", "test:latest", "os:system"])
def test_a_model_name_that_reads_as_no_agent_is_its_own(model):
    spec = resolve_agent("model", {"model": model, "base_url": "http://127.0.0.1:9/v1"})
    assert spec.identity == model


def test_a_plugin_installed_after_a_model_run_named_like_it_leaves_the_run_verified(tmp_path, capsys, monkeypatch):
    """A model's name is checked against the agents installed when it runs; a plugin installed later under the same
    name (deterministic, so gate would play it again) does not make the honest run fail: a note says so. A model
    named as one of gate's own agents stays a failure
    (test_a_model_named_after_an_agent_gate_plays_again_is_refused_and_never_passes_verify)."""
    from scripted_server import ScriptedServer

    from gate_pipeline.kernel import agents
    with ScriptedServer() as server:
        assert main(["run", "--model", "plugx", "--base-url", server.url, "-n", "2", "--run-id", "m",
                     "--runs-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    site = tmp_path / "site"
    (site / "plugx_mod").mkdir(parents=True)
    (site / "plugx_mod" / "__init__.py").write_text(
        "class Plug:\n    deterministic = True\n\n    def play(self, tools, case=None):\n"
        "        tools('submit_report', loaded=[], quarantined=[])\n")
    info = site / "plugx-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugx\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gate.agents]\nplugx = plugx_mod:Plug\n")
    monkeypatch.syspath_prepend(str(site))
    agents._entry_points.cache_clear()
    try:
        assert "plugx" in agents.agent_names()
        code, out, _ = verify(capsys, "--run", str(tmp_path / "m"))
    finally:
        monkeypatch.undo()
        agents._entry_points.cache_clear()
    assert code == 0, out
    assert "is named like 'plugx', a plugin agent installed here that gate plays again" in out, out


def test_a_variant_of_gates_own_agent_is_gates_own_whatever_is_installed():
    """Verify fails a model episode named as one of gate's own agents, notes one named as a plugin: a variant of
    gate's careful (`careful@full`) is gate's own, and was taken for a plugin."""
    from gate_pipeline.kernel.agents import is_gates_own
    assert is_gates_own("careful@full") and is_gates_own("naive") and is_gates_own("careful-sql")
    assert not is_gates_own("plugx") and not is_gates_own("gpt-4o@2024")


def test_a_case_the_changed_case_file_no_longer_holds_is_a_failure(home, night, capsys):
    """A case file changed since its run said nothing of a case it no longer held, so with the key a stored case
    renamed (a look-alike id, the manifest's hash of the file made up) passed with a note. A run's case the file
    does not hold is a failure now: keep case files as they were played."""
    kept = [c for c in read_cases(night) if c.case_id != BAD]
    write_cases(night, kept)
    code, out, _ = verify(capsys)
    assert code == 1 and f"{BAD} naive: its case is not in the case file {night}" in out, out
    assert "changed since the run was sealed" in out
    assert not any(f"{c.case_id} naive: its case is not" in out for c in kept), out


def test_a_case_file_in_the_stores_folder_is_named_as_no_check(tmp_path, monkeypatch, capsys):
    """Whoever can write GATE_HOME can write a case file kept there, and point a run's manifest at it with the key:
    verify passed such a run with no word of where its cases were checked. It says so now."""
    home = tmp_path / "home"
    monkeypatch.setenv("GATE_HOME", str(home))
    monkeypatch.delenv("GATE_STORE_KEY", raising=False)
    monkeypatch.delenv("GATE_STORE_KEY_FILE", raising=False)
    home.mkdir()
    cases = home / "two.jsonl"
    write_cases(cases, read_cases(EVAL)[:2])
    assert main(["nightly", "--cases", str(cases), "--agents", "naive"]) == 0
    capsys.readouterr()
    code, out, _ = verify(capsys)
    assert code == 0 and f"its case file {cases} is in the store's folder {home}" in out, out

