"""Runs on disk, so a grader in another process can grade what really happened.

Each episode played under orchestration writes its ledger as it plays, one row per tool call
before the agent sees the result, to a run store reached through SQLAlchemy (default a
SQLite file in GATE_HOME, which defaults to `.gate/` in the working directory; any database
URL through GATE_DB_URL), and its warehouse to a SQLite file under GATE_HOME when it ends,
however it ends (an episode plays on an in-memory copy: a file per call costs fsyncs). Grading reads only the stored
warehouse, the stored ledger and the case's truth labels (`grader.grade_record`), never
what the agent said. A grade is computed once per episode (its row is the marker) and kept
with a sequence number, so a consumer can emit each grade once with a cursor, across
restarts. Nightly benchmark summaries are kept too, as the scoreboard's history.

This module is plain Python: the core may use it and it never imports Dagster.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import uuid
from pathlib import Path

from sqlalchemy import (Column, Float, Integer, MetaData, String, Table, Text, create_engine, event, insert,
                        select, update)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from .grader import TERMS, grade_record
from .world import PreparedCase, World, mart_revenue

HOME_ENV, URL_ENV = "GATE_HOME", "GATE_DB_URL"
RUNNING, ENDED = "running", "ended"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

_meta = MetaData()
episodes = Table(
    "episodes", _meta,
    Column("episode_id", String(64), primary_key=True),
    Column("dagster_run_id", String(64), index=True),
    Column("case_id", String(200), index=True, nullable=False),
    Column("agent", String(200), nullable=False),
    Column("agent_options", Text, nullable=False),
    Column("case_json", Text, nullable=False),
    Column("warehouse", Text, nullable=False),  # path relative to GATE_HOME
    Column("status", String(16), nullable=False),
    Column("error", Text),
    Column("ledger_digest", String(64)),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
)
ledger_rows = Table(
    "ledger_entries", _meta,
    Column("episode_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("entry", Text, nullable=False),
)
grades = Table(
    "grades", _meta,
    Column("grade_seq", Integer, primary_key=True, autoincrement=True),
    Column("episode_id", String(64), unique=True, nullable=False),
    Column("case_id", String(200), index=True, nullable=False),
    Column("agent", String(200), nullable=False),
    Column("grade", Text, nullable=False),
    Column("graded_at", Float, nullable=False),
)
nightly = Table(
    "nightly_scores", _meta,
    Column("night_seq", Integer, primary_key=True, autoincrement=True),
    Column("dagster_run_id", String(64)),
    Column("at", Float, nullable=False),
    Column("summary", Text, nullable=False),
)


class StoreError(RuntimeError):
    """The run store cannot be opened or read (bad URL, unwritable GATE_HOME, unknown episode)."""


def gate_home(home: str | Path | None = None) -> Path:
    return Path(home or os.environ.get(HOME_ENV) or ".gate").resolve()


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers (the sensor) never block the writer
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def failed_grade(grade: dict, reason: str) -> dict:
    """A failed run scores 0 on every term, whatever it did before failing; the reason is kept."""
    return {**grade, **dict.fromkeys(TERMS, 0.0), "reward": 0.0, "failed": True, "reason": reason}


class RunStore:
    """Episodes, their ledgers and grades, and nightly summaries, under one GATE_HOME."""

    def __init__(self, home: str | Path | None = None, url: str | None = None):
        self.home = gate_home(home)
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"GATE_HOME {self.home}: cannot create it ({exc.strerror or exc})") from None
        self.url = url or os.environ.get(URL_ENV) or f"sqlite:///{self.home / 'runs.db'}"
        try:
            self.engine = create_engine(self.url)
        except (SQLAlchemyError, ValueError, ImportError) as exc:
            raise StoreError(f"run store URL {self.url!r}: {exc}") from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            _meta.create_all(self.engine)
        except SQLAlchemyError as exc:
            raise StoreError(f"run store {self.url!r}: {str(exc).splitlines()[0]}") from None
        self._correct: dict[str, float] = {}

    def dispose(self) -> None:
        self.engine.dispose()

    # -- writing an episode -----------------------------------------------------------------
    def start_episode(self, prepared: PreparedCase, agent: str, options: dict | None = None,
                      dagster_run_id: str | None = None) -> tuple[str, Path]:
        """Register an episode; returns its id and the path its warehouse file must live at."""
        episode_id = uuid.uuid4().hex
        rel = Path("warehouses") / _UNSAFE.sub("_", prepared.case_id) / f"{episode_id}.sqlite"
        (self.home / rel).parent.mkdir(parents=True, exist_ok=True)
        with self.engine.begin() as c:
            c.execute(insert(episodes).values(
                episode_id=episode_id, dagster_run_id=dagster_run_id, case_id=prepared.case_id, agent=agent,
                agent_options=json.dumps(options or {}, sort_keys=True, default=repr),
                case_json=json.dumps(prepared.case, sort_keys=True), warehouse=str(rel), status=RUNNING,
                started_at=time.time()))
        return episode_id, self.home / rel

    def append_entry(self, episode_id: str, entry: dict) -> None:
        with self.engine.begin() as c:
            c.execute(insert(ledger_rows).values(episode_id=episode_id, seq=entry["seq"],
                                                 entry=json.dumps(entry, sort_keys=True)))

    def end_episode(self, episode_id: str, error: str | None = None) -> None:
        entries = self.entries(episode_id)
        digest = entries[-1]["hash"] if entries else "genesis"
        with self.engine.begin() as c:
            c.execute(update(episodes).where(episodes.c.episode_id == episode_id, episodes.c.status == RUNNING)
                      .values(status=ENDED, error=error, ledger_digest=digest, ended_at=time.time()))

    def fail_unstarted(self, prepared: PreparedCase, agent: str, options: dict | None,
                       dagster_run_id: str | None, reason: str) -> str:
        """Record a run that failed before its agent played (e.g. an unknown agent name)."""
        episode_id, path = self.start_episode(prepared, agent, options, dagster_run_id)
        world = World(prepared)
        save_warehouse(world.conn, path)  # the untouched warehouse, so the record is complete
        world.close()
        self.end_episode(episode_id, reason)
        return episode_id

    # -- reading ------------------------------------------------------------------------------
    def episode(self, episode_id: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(episodes).where(episodes.c.episode_id == episode_id)).mappings().first()
        if row is None:
            raise StoreError(f"no episode {episode_id!r} in {self.url}")
        return dict(row)

    def episodes_of_run(self, dagster_run_id: str) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(select(episodes).where(episodes.c.dagster_run_id == dagster_run_id)
                             .order_by(episodes.c.started_at)).mappings().all()
        return [dict(r) for r in rows]

    def running(self) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(select(episodes).where(episodes.c.status == RUNNING)).mappings().all()
        return [dict(r) for r in rows]

    def entries(self, episode_id: str) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(select(ledger_rows.c.entry).where(ledger_rows.c.episode_id == episode_id)
                             .order_by(ledger_rows.c.seq)).scalars().all()
        return [json.loads(r) for r in rows]

    def warehouse_path(self, episode: dict) -> Path:
        return self.home / episode["warehouse"]

    def stored_mart(self, episode: dict) -> float:
        """The revenue mart of the stored warehouse file, opened read-only."""
        path = self.warehouse_path(episode)
        if not path.is_file():
            raise StoreError(f"episode {episode['episode_id']}: warehouse file {path} is missing")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return mart_revenue(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"episode {episode['episode_id']}: warehouse unreadable ({exc})") from None
        finally:
            conn.close()

    # -- grading ------------------------------------------------------------------------------
    def compute_grade(self, episode_id: str) -> dict:
        """The grade from the stored warehouse, the stored ledger and the case's truth (pure)."""
        ep = self.episode(episode_id)
        case = json.loads(ep["case_json"])
        key = ep["case_json"]  # the case as this episode played it (a regenerated file may reuse an id)
        if key not in self._correct:
            self._correct[key] = PreparedCase(case).correct_mart
        correct = self._correct[key]
        entries = self.entries(episode_id)
        reason = ep["error"]
        try:
            mart = self.stored_mart(ep)
        except StoreError as exc:
            mart, reason = 0.0, reason or str(exc)
        grade = grade_record(case, entries, mart, correct)
        grade.update(agent=ep["agent"], episode_id=episode_id, dagster_run_id=ep["dagster_run_id"],
                     ledger_digest=entries[-1]["hash"] if entries else "genesis", calls=len(entries))
        if reason:
            return failed_grade(grade, reason)
        return {**grade, "failed": False, "reason": ""}

    def ungraded(self) -> list[str]:
        """Ended episodes with no grade yet, oldest first."""
        with self.engine.connect() as c:
            graded = select(grades.c.episode_id)
            ids = c.execute(select(episodes.c.episode_id)
                            .where(episodes.c.status == ENDED, episodes.c.episode_id.not_in(graded))
                            .order_by(episodes.c.ended_at)).scalars().all()
        return list(ids)

    def record_grade(self, episode_id: str) -> bool:
        """Grade an ended episode once; False if it already had a grade (nothing is changed)."""
        grade = self.compute_grade(episode_id)
        try:
            with self.engine.begin() as c:
                c.execute(insert(grades).values(episode_id=episode_id, case_id=grade["case_id"],
                                                agent=grade["agent"], grade=json.dumps(grade, sort_keys=True),
                                                graded_at=time.time()))
        except IntegrityError:
            return False
        return True

    def grades_after(self, grade_seq: int) -> list[tuple[int, dict]]:
        with self.engine.connect() as c:
            rows = c.execute(select(grades.c.grade_seq, grades.c.grade).where(grades.c.grade_seq > grade_seq)
                             .order_by(grades.c.grade_seq)).all()
        return [(seq, json.loads(g)) for seq, g in rows]

    def latest_grades(self, case_id: str) -> dict[str, dict]:
        """{agent: its latest recorded grade} for one case."""
        with self.engine.connect() as c:
            rows = c.execute(select(grades.c.agent, grades.c.grade).where(grades.c.case_id == case_id)
                             .order_by(grades.c.grade_seq)).all()
        return {agent: json.loads(g) for agent, g in rows}

    def grade_count(self, episode_id: str) -> int:
        with self.engine.connect() as c:
            return len(c.execute(select(grades.c.grade_seq).where(grades.c.episode_id == episode_id)).all())

    # -- nightly history ----------------------------------------------------------------------
    def add_nightly(self, summary: dict, dagster_run_id: str | None = None) -> int:
        with self.engine.begin() as c:
            result = c.execute(insert(nightly).values(dagster_run_id=dagster_run_id, at=time.time(),
                                                      summary=json.dumps(summary, sort_keys=True)))
            return int(result.inserted_primary_key[0])

    def nightly_history(self, limit: int = 30) -> list[dict]:
        """The last `limit` nightly summaries, oldest first: {night, dagster_run_id, at, summary}."""
        with self.engine.connect() as c:
            rows = c.execute(select(nightly).order_by(nightly.c.night_seq.desc()).limit(limit)).mappings().all()
        return [{"night": r["night_seq"], "dagster_run_id": r["dagster_run_id"], "at": r["at"],
                 "summary": json.loads(r["summary"])} for r in reversed(rows)]


def save_warehouse(conn: sqlite3.Connection, path: Path) -> None:
    """Copy an episode's database to its warehouse file (written whole, then renamed into place)."""
    tmp = path.with_suffix(".partial")
    disk = sqlite3.connect(str(tmp))
    try:
        disk.execute("PRAGMA synchronous=OFF")
        conn.backup(disk)
    finally:
        disk.close()
    os.replace(tmp, path)


def play_stored(store: RunStore, prepared: PreparedCase, agent_name: str, options: dict | None = None,
                dagster_run_id: str | None = None, on_call=None) -> tuple[str, str | None]:
    """Play one episode with its warehouse and ledger on disk; returns (episode id, error or None).

    Every tool call goes to the episode, then each ledger entry it wrote goes to the store
    before the agent sees the result; `on_call(tool, args, result, new_entries, episode, episode_id)` is
    called after that (the Dagster bridge emits its events there). An agent that cannot be
    made, or that raises, ends the episode with the error recorded (it will grade 0).
    """
    from .agents import UnknownAgent, make_agent
    from .tools import Episode

    options = dict(options or {})
    try:
        agent = make_agent(agent_name, **options)
    except UnknownAgent as exc:
        return store.fail_unstarted(prepared, str(agent_name), options, dagster_run_id, str(exc)), str(exc)
    episode_id, path = store.start_episode(prepared, agent_name, options, dagster_run_id)
    episode = Episode(prepared)  # in memory while it plays; the ledger goes to disk call by call
    stored = 0

    def tools(name, **args):
        nonlocal stored
        result = episode.call(name, args)
        new = episode.ledger.entries[stored:]
        for entry in new:
            store.append_entry(episode_id, entry)
        stored += len(new)
        if on_call is not None:
            on_call(name, args, result, new, episode, episode_id)
        return result

    error = "interrupted before the agent finished"
    try:
        agent.play(tools, prepared.case if getattr(agent, "oracle", False) else None)
        error = None
    except Exception as exc:  # an agent's bug ends its episode, never the run store
        error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            save_warehouse(episode.world.conn, path)
        finally:
            episode.close()
            store.end_episode(episode_id, error)
    return episode_id, error
