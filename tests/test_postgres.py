"""gate on a real PostgreSQL server: the run store, `gate verify` from another machine's home, the
nightly job with Dagster's own storage in the same database (two nightly processes at once), the
grading sensor, and bad URLs (one line, exit 2, nothing lost).

The server is Debian's PostgreSQL, started by tests/servers.py in a temporary directory for this
module and stopped with its whole process group at the end; each test has a database of its own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from servers import PG_PASSWORD, need, postgres

from gate_pipeline.cli.main import main
from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.instance import prepare_instance_dir
from gate_pipeline.dagster_defs.resources import CaseLibrary, GateStore
from gate_pipeline.dagster_defs.webserver import free_port
from gate_pipeline.kernel.cases import read_cases, write_cases
from gate_pipeline.kernel.engine import play_cases
from gate_pipeline.kernel.grading import grade_stored
from gate_pipeline.kernel.records import Grade
from gate_pipeline.store import RunStore, StoreSink
from gate_pipeline.tables import summary

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
AGENTS = ["naive", "careful", "refuse-all"]
KEY = "a-key-every-machine-of-this-test-shares-0123456789"


@pytest.fixture(scope="module")
def server():
    need("postgresql")
    with postgres() as pg:
        yield pg


@pytest.fixture
def db_url(server, monkeypatch, tmp_path):
    """A database of this test's own on the server; GATE_DB_URL and a shared GATE_STORE_KEY set."""
    url = server.create_database(f"gate_{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("GATE_DB_URL", url)
    monkeypatch.setenv("GATE_STORE_KEY", KEY)
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "machine-a"))
    return url


def sql(url: str, query: str, *args):
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        cur = conn.execute(query, args)
        return cur.fetchall() if cur.description else None


def test_every_episode_lives_in_the_database_and_another_machine_verifies_it(db_url, tmp_path, monkeypatch, capsys):
    cases = read_cases(EVAL)[:6]
    store = RunStore()
    results = play_cases(cases, AGENTS, sinks=[StoreSink(store)], run_id="night-a")
    for rs in results.values():
        for r in rs:  # graded again from the stored warehouse and ledger: the same grade
            assert grade_stored(store.load(r.episode_id)) == r.grade
    store.dispose()
    assert not (tmp_path / "machine-a" / "warehouses").exists()  # nothing under GATE_HOME: all in the database
    assert sql(db_url, "SELECT COUNT(*) FROM warehouses")[0][0] == len(cases) * len(AGENTS)
    assert sql(db_url, "SELECT COUNT(*) FROM cases")[0][0] == len(cases)  # each case once, whatever plays it
    assert sql(db_url, "SELECT COUNT(*) FROM episodes WHERE case_json <> ''")[0][0] == 0

    monkeypatch.setenv("GATE_HOME", str(tmp_path / "machine-b"))  # another machine: the URL and the key only
    assert main(["verify"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("every check holds") and f"{len(cases) * len(AGENTS)} episodes checked" in out
    assert PG_PASSWORD not in out

    naive = results["naive"][2].episode_id  # its warehouse, edited in the database, is caught
    image = sql(db_url, "SELECT image FROM warehouses WHERE episode_id = %s", naive)[0][0]
    sql(db_url, "UPDATE warehouses SET image = %s WHERE episode_id = %s", bytes(image) + b"\0", naive)
    assert main(["verify"]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("note: ")]
    assert lines[0].startswith(f"{naive} ") and "was altered" in lines[0]
    assert grade_stored(RunStore().load(naive)).reward == 0.0


def test_a_write_that_fails_in_a_held_pipeline_keeps_nothing_and_the_next_is_kept(db_url):
    """In `holding` (a night's chunk) each transaction's statements and COMMIT go to the server in one pipeline:
    a write that fails raises, keeps nothing of its transaction (the episode opening with it neither), and the
    connection goes on: the next transaction is kept."""
    from gate_pipeline.kernel.engine import EpisodeStart, Sink, play, prepare

    class Starts(Sink):
        wants_warehouse = True

        def __init__(self):
            self.seen: list[EpisodeStart] = []

        def start(self, episode: EpisodeStart) -> None:
            self.seen.append(episode)

    cases = read_cases(EVAL)[:2]
    store = RunStore()
    starts = Starts()
    with store.holding():
        first = play(prepare(cases[0]), "naive", sinks=[StoreSink(store, batch=1)], run_id="held")
        second = play(prepare(cases[1]), "careful", sinks=[starts], run_id="held")  # not stored yet
        with pytest.raises(psycopg.errors.UniqueViolation):  # the first's ledger again: its keys are taken
            store.end_episodes([(first, starts.seen[0])], opening=starts.seen[0])
        assert sql(db_url, "SELECT COUNT(*) FROM episodes")[0][0] == 1  # the opening episode was not kept
        store.end_episodes([(second, starts.seen[0])])  # the same connection, the next transaction
    rows = {r["episode_id"]: r for r in store.episodes(run_id="held")}
    assert set(rows) == {first.episode_id, second.episode_id}
    assert sql(db_url, "SELECT COUNT(*) FROM ledger_entries")[0][0] == len(first.ledger) + len(second.ledger)
    for r in (first, second):
        assert grade_stored(store.load(r.episode_id)) == r.grade
    store.dispose()


NIGHTLY = """
import sys
import dagster as dg
from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.jobs import nightly_run_config

def nightly_job():
    return defs.resolve_job_def("nightly_benchmark")

if __name__ == "__main__":  # Dagster imports this file again to rebuild the job
    with dg.DagsterInstance.get() as instance:
        with dg.execute_job(dg.reconstructable(nightly_job), instance,
                            run_config=nightly_run_config(sys.argv[1], chunk_size=4)) as result:
            print(result.run_id, result.success, flush=True)
"""


def test_two_nightly_processes_at_once_then_the_grading_sensor(db_url, tmp_path, capsys):
    """Dagster's storage in the same database (the dagster.yaml `gate ui` writes for a PostgreSQL
    URL); two nightly jobs in two processes write at once; each scoreboard is `gate report`'s;
    the sensor grades every episode once; `gate verify` holds."""
    dagster_home = tmp_path / "dagster"
    prepare_instance_dir(dagster_home, db_url)
    assert "dagster-postgres" in (dagster_home / "dagster.yaml").read_text()
    assert (dagster_home / "dagster.yaml").stat().st_mode & 0o077 == 0  # it holds the password
    with dg.DagsterInstance.from_config(str(dagster_home)):  # its tables made once, as `gate ui` does first
        pass
    small = tmp_path / "eval_16.jsonl"
    write_cases(small, read_cases(EVAL)[:16])
    script = tmp_path / "nightly.py"
    script.write_text(NIGHTLY)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home)}
    procs = [subprocess.Popen([sys.executable, str(script), str(small)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for _ in range(2)]
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        assert proc.returncode == 0, err[-3000:]
        outs.append(out.strip().splitlines()[-1].split())
    assert [ok for _, ok in outs] == ["True", "True"]
    run_ids = {run_id for run_id, _ in outs}

    assert main(["report", "--json", "--cases", str(small)]) == 0
    reported = json.loads(capsys.readouterr().out)["agents"]
    store = RunStore()
    nights = store.nightly_history()
    assert {n["run_id"] for n in nights} == run_ids
    typed = {agent: [Grade.from_dict(g) for g in gs] for agent, gs in reported.items()}
    for night in nights:
        assert night["summary"] == {**summary(read_cases(small), typed), "cases_file": str(small)}

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        runs = instance.get_runs()
        assert {r.run_id for r in runs} == run_ids and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert sql(db_url, "SELECT COUNT(*) FROM runs")[0][0] == 2  # Dagster's own table, in the same database
        sensor = defs.resolve_sensor_def("grading_sensor")
        resources = {"gate_store": GateStore(), "case_library": CaseLibrary()}
        first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources))
        episodes = 2 * 16 * len(AGENTS)
        assert len(first.asset_events) == episodes and first.cursor.split(" · ")[0] == str(episodes)
        again = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=first.cursor,
                                                             resources=resources))
        assert again.skip_message == "no new grades"
    assert store.ungraded() == [] and all(store.grade_count(e["episode_id"]) == 1 for e in store.episodes())
    # the two nights stored the same 16 cases at once: each is kept once (a second INSERT of a case does nothing)
    assert sql(db_url, "SELECT COUNT(*) FROM cases")[0][0] == 16
    assert main(["verify"]) == 0


def test_gate_nightly_on_postgres_and_bad_urls(db_url, server, tmp_path, monkeypatch, capsys):
    small = tmp_path / "eval_4.jsonl"
    write_cases(small, read_cases(EVAL)[:4])
    assert main(["nightly", "--cases", str(small)]) == 0
    assert capsys.readouterr().out.startswith("eval split: 4 cases")
    kept = sql(db_url, "SELECT COUNT(*) FROM episodes")[0][0]
    assert kept == 4 * len(AGENTS)

    wrong_password = db_url.replace(PG_PASSWORD, "not-the-password")
    bad = {"nothing listens there": f"postgresql+psycopg://gate:{PG_PASSWORD}@127.0.0.1:{free_port()}/x",
           "a wrong password": wrong_password,
           "no such database": db_url.rsplit("/", 1)[0] + "/no_such_database",
           "no such driver": "postgresql+nosuchdriver://gate@127.0.0.1/x",
           "not a URL": "this is not a url"}
    for what, url in bad.items():
        monkeypatch.setenv("GATE_DB_URL", url)
        for argv in (["nightly", "--cases", str(small)], ["verify"], ["ui", "--port", str(free_port())]):
            assert main(argv) == 2, (what, argv)
            captured = capsys.readouterr()
            assert captured.out == "", (what, argv)
            lines = captured.err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("gate: error: "), (what, argv, captured.err)
            assert PG_PASSWORD not in captured.err and "not-the-password" not in captured.err, (what, argv)
    monkeypatch.setenv("GATE_DB_URL", db_url)  # nothing was lost
    assert sql(db_url, "SELECT COUNT(*) FROM episodes")[0][0] == kept
    assert main(["verify"]) == 0
