"""The run store: episodes played under orchestration, kept so another process can grade them.

Persistence only: it plays nothing and grades nothing. `StoreSink` (an engine sink) writes
an episode's row when it opens, and when it ends, in one transaction, its ledger and how it
ended (with the ledger's last hash and length), with its final warehouse as a SQLite file
under GATE_HOME. `load` gives a `StoredEpisode` back
for the grader (`grader.grade_stored`); grades are kept once per episode, with a sequence
number, so a consumer (the grading sensor) can emit each one once across restarts. Nightly
summaries are kept too, as the scoreboard's history. The database is any SQLAlchemy URL
(default a SQLite file in GATE_HOME).
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path

from sqlalchemy import (Column, Float, Integer, MetaData, String, Table, Text, bindparam, create_engine, event, insert,
                        select, update)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from .engine import EpisodeStart, Sink
from .ledger import last_hash
from .records import ABANDONED, EpisodeResult, Grade, StoredEpisode
from .settings import Settings
from .world import mart_revenue

SCHEMA_VERSION = "2"
RUNNING, ENDED = "running", "ended"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

_meta = MetaData()
store_meta = Table(
    "gate_store", _meta,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)
episodes = Table(
    "episodes", _meta,
    Column("episode_id", String(64), primary_key=True),
    Column("run_id", String(200), index=True, nullable=False),  # a Dagster run id, or a `gate run` id
    Column("rollout", Integer, nullable=False),
    Column("case_id", String(200), index=True, nullable=False),
    Column("agent", String(200), nullable=False),
    Column("agent_options", Text, nullable=False),
    Column("case_json", Text, nullable=False),
    Column("warehouse", Text, nullable=False),  # path relative to GATE_HOME
    Column("status", String(16), nullable=False),
    Column("end_reason", String(32)),
    Column("error", Text),
    Column("ledger_digest", String(64)),
    Column("ledger_entries", Integer),
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
    Column("run_id", String(200)),
    Column("at", Float, nullable=False),
    Column("summary", Text, nullable=False),
)


class StoreError(RuntimeError):
    """The run store cannot be opened or read (bad URL, unwritable GATE_HOME, unknown episode)."""


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers (the sensor) never block the writer
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def save_warehouse(image: bytes, path: Path) -> None:
    """Write an episode's final database image to its warehouse file (whole, then renamed into place)."""
    tmp = path.with_suffix(".partial")
    try:
        tmp.write_bytes(image)
    except FileNotFoundError:  # its folder went away since it was made
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(image)
    os.replace(tmp, path)


def read_mart(path: Path) -> float:
    """The revenue mart of a stored warehouse file, opened read-only; StoreError if it cannot be read."""
    if not path.is_file():
        raise StoreError(f"warehouse file {path} is missing")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return mart_revenue(conn)
    except sqlite3.Error as exc:
        raise StoreError(f"warehouse file {path} is unreadable ({exc})") from None
    finally:
        conn.close()


class RunStore:
    """Episodes, their ledgers and grades, and nightly summaries, under one GATE_HOME."""

    def __init__(self, settings: Settings | None = None):
        settings = settings or Settings.from_env()
        self.home = settings.home
        self.url = settings.store_url
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"GATE_HOME {self.home}: cannot create it ({exc.strerror or exc})") from None
        try:
            self.engine = create_engine(self.url)
        except (SQLAlchemyError, ValueError, ImportError) as exc:
            raise StoreError(f"run store URL {self.url!r}: {exc}") from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            _meta.create_all(self.engine)
            self._check_version()
        except SQLAlchemyError as exc:
            raise StoreError(f"run store {self.url!r}: {str(exc).splitlines()[0]}") from None
        self._cases: dict[int, tuple[dict, str]] = {}
        self._folders: set[Path] = set()

    def _check_version(self) -> None:
        with self.engine.begin() as c:
            version = c.execute(select(store_meta.c.value).where(store_meta.c.key == "schema")).scalar()
            if version is None:
                c.execute(insert(store_meta).values(key="schema", value=SCHEMA_VERSION))
            elif version != SCHEMA_VERSION:
                raise StoreError(f"run store {self.url} has schema {version}; this gate reads {SCHEMA_VERSION}: "
                                 f"move it away or set GATE_HOME / GATE_DB_URL to a new place")

    def dispose(self) -> None:
        self.engine.dispose()

    # -- writing an episode (StoreSink calls these) ---------------------------------------------
    def warehouse_relpath(self, case_id: str, episode_id: str) -> Path:
        return Path("warehouses") / _UNSAFE.sub("_", case_id) / f"{episode_id}.sqlite"

    def _case_text(self, case: dict) -> str:
        """The case as stored (sorted JSON), made once per case object: rollouts of a case share it."""
        key = id(case)
        known = self._cases.get(key)
        if known is None or known[0] is not case:
            if len(self._cases) > 4096:
                self._cases.clear()
            known = self._cases[key] = (case, json.dumps(case, sort_keys=True))
        return known[1]

    def _row(self, start: EpisodeStart) -> dict:
        rel = self.warehouse_relpath(start.case["case_id"], start.episode_id)
        if rel.parent not in self._folders:
            (self.home / rel.parent).mkdir(parents=True, exist_ok=True)
            self._folders.add(rel.parent)
        return {"episode_id": start.episode_id, "run_id": start.run_id, "rollout": start.rollout,
                "case_id": start.case["case_id"], "agent": start.agent,
                "agent_options": json.dumps(start.options, sort_keys=True, default=repr),
                "case_json": self._case_text(start.case), "warehouse": str(rel), "status": RUNNING,
                "started_at": start.started_at, "end_reason": None, "error": None, "ledger_digest": None,
                "ledger_entries": None, "ended_at": None}

    def start_episode(self, start: EpisodeStart) -> None:
        with self.engine.begin() as c:
            c.execute(insert(episodes), [self._row(start)])

    def end_episode(self, result: EpisodeResult, start: EpisodeStart | None = None) -> None:
        """Keep an ended episode (see `end_episodes`)."""
        self.end_episodes([(result, start)])

    def end_episodes(self, ended: list[tuple[EpisodeResult, EpisodeStart | None]]) -> None:
        """Keep ended episodes, in one transaction: each one's ledger, how it ended (with the chain's
        last hash and length, to check the stored ledger against later) and its final warehouse;
        with its row, when its start is given (an episode that was not announced when it opened)."""
        new, updates, ledgers = [], [], []
        for result, start in ended:
            end = {"status": ENDED, "end_reason": result.end_reason, "error": result.error or None,
                   "ledger_digest": last_hash(result.ledger), "ledger_entries": len(result.ledger),
                   "ended_at": time.time()}
            if start is not None:
                new.append({**self._row(start), **end})
            else:
                updates.append({"key": result.episode_id, **end})
            if result.warehouse is not None:
                save_warehouse(result.warehouse, self.home / self.warehouse_relpath(result.case_id, result.episode_id))
            ledgers += [{"episode_id": result.episode_id, "seq": e["seq"], "entry": json.dumps(e, sort_keys=True)}
                        for e in result.ledger]
        with self.engine.begin() as c:
            if new:
                c.execute(insert(episodes), new)
            if updates:
                c.execute(update(episodes).where(episodes.c.episode_id == bindparam("key"),
                                                 episodes.c.status == RUNNING), updates)
            if ledgers:
                c.execute(insert(ledger_rows), ledgers)

    def close_abandoned(self, episode_id: str, reason: str) -> bool:
        """End an episode whose process died before it did (its warehouse may never have been
        written); it grades 0 with `reason`. False if it had already ended."""
        with self.engine.begin() as c:
            done = c.execute(update(episodes).where(episodes.c.episode_id == episode_id,
                                                    episodes.c.status == RUNNING)
                             .values(status=ENDED, end_reason=ABANDONED, error=reason, ended_at=time.time()))
        return done.rowcount == 1

    # -- reading ------------------------------------------------------------------------------
    def episode(self, episode_id: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(episodes).where(episodes.c.episode_id == episode_id)).mappings().first()
        if row is None:
            raise StoreError(f"no episode {episode_id!r} in {self.url}")
        return dict(row)

    def episodes(self, run_id: str | None = None, status: str | None = None) -> list[dict]:
        """Episode rows, oldest first, optionally of one run and in one status."""
        query = select(episodes).order_by(episodes.c.started_at)
        if run_id is not None:
            query = query.where(episodes.c.run_id == run_id)
        if status is not None:
            query = query.where(episodes.c.status == status)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(query).mappings().all()]

    def entries(self, episode_id: str) -> list[dict]:
        with self.engine.connect() as c:
            rows = c.execute(select(ledger_rows.c.entry).where(ledger_rows.c.episode_id == episode_id)
                             .order_by(ledger_rows.c.seq)).scalars().all()
        return [json.loads(r) for r in rows]

    def warehouse_path(self, episode: dict) -> Path:
        return self.home / episode["warehouse"]

    def load(self, episode_id: str) -> StoredEpisode:
        """The episode as stored: case, ledger and the mart of its warehouse file."""
        row = self.episode(episode_id)
        problems = []
        try:
            mart = read_mart(self.warehouse_path(row))
        except StoreError as exc:
            mart = None
            problems.append(str(exc))
        return StoredEpisode(
            episode_id=episode_id, case=json.loads(row["case_json"]), agent=row["agent"],
            options=json.loads(row["agent_options"]), run_id=row["run_id"], rollout=row["rollout"],
            status=row["status"], end_reason=row["end_reason"] or "", error=row["error"] or "",
            entries=self.entries(episode_id), ledger_digest=row["ledger_digest"] or "", mart=mart,
            problems=tuple(problems), case_json=row["case_json"])

    # -- grades -------------------------------------------------------------------------------
    def ungraded(self) -> list[str]:
        """Ended episodes with no grade yet, oldest first."""
        with self.engine.connect() as c:
            graded = select(grades.c.episode_id)
            ids = c.execute(select(episodes.c.episode_id)
                            .where(episodes.c.status == ENDED, episodes.c.episode_id.not_in(graded))
                            .order_by(episodes.c.ended_at)).scalars().all()
        return list(ids)

    def add_grade(self, episode_id: str, agent: str, grade: Grade) -> bool:
        """Keep an episode's grade once; False if it already had one (nothing is changed)."""
        record = {**grade.as_dict(), "agent": agent, "episode_id": episode_id}
        try:
            with self.engine.begin() as c:
                c.execute(insert(grades).values(episode_id=episode_id, case_id=grade.case_id, agent=agent,
                                                grade=json.dumps(record, sort_keys=True), graded_at=time.time()))
        except IntegrityError:
            return False
        return True

    def grades_after(self, grade_seq: int) -> list[tuple[int, dict]]:
        with self.engine.connect() as c:
            rows = c.execute(select(grades.c.grade_seq, grades.c.grade).where(grades.c.grade_seq > grade_seq)
                             .order_by(grades.c.grade_seq)).all()
        return [(seq, json.loads(g)) for seq, g in rows]

    def latest_grades(self, case_id: str) -> dict[str, dict]:
        """{agent: its latest kept grade} for one case."""
        with self.engine.connect() as c:
            rows = c.execute(select(grades.c.agent, grades.c.grade).where(grades.c.case_id == case_id)
                             .order_by(grades.c.grade_seq)).all()
        return {agent: json.loads(g) for agent, g in rows}

    def grade_count(self, episode_id: str) -> int:
        with self.engine.connect() as c:
            return len(c.execute(select(grades.c.grade_seq).where(grades.c.episode_id == episode_id)).all())

    # -- nightly history ----------------------------------------------------------------------
    def add_nightly(self, summary: dict, run_id: str | None = None) -> int:
        with self.engine.begin() as c:
            result = c.execute(insert(nightly).values(run_id=run_id, at=time.time(),
                                                      summary=json.dumps(summary, sort_keys=True)))
            return int(result.inserted_primary_key[0])

    def nightly_history(self, limit: int = 30) -> list[dict]:
        """The last `limit` nightly summaries, oldest first: {night, run_id, at, summary}."""
        with self.engine.connect() as c:
            rows = c.execute(select(nightly).order_by(nightly.c.night_seq.desc()).limit(limit)).mappings().all()
        return [{"night": r["night_seq"], "run_id": r["run_id"], "at": r["at"],
                 "summary": json.loads(r["summary"])} for r in reversed(rows)]


class StoreSink(Sink):
    """The engine sink that keeps every episode it sees in a run store: its row when it opens (so an
    episode whose process dies is known, and graded 0), then everything else when it ends.

    `announce=False` writes nothing until the episode ends, and `batch` keeps that many ended
    episodes before writing them in one transaction (`flush` writes what is kept): for callers
    that play a cut-off or unwritten episode again rather than grade it (`gate run` on resume)."""
    wants_warehouse = True

    def __init__(self, store: RunStore, announce: bool = True, batch: int = 1):
        self.store = store
        self.announce = announce
        self.batch = batch
        self.starts: dict[str, EpisodeStart] = {}
        self.ended: list[tuple[EpisodeResult, EpisodeStart | None]] = []

    def start(self, episode: EpisodeStart) -> None:
        if self.announce:
            self.store.start_episode(episode)
        else:
            self.starts[episode.episode_id] = episode

    def end(self, result: EpisodeResult) -> None:
        self.ended.append((result, self.starts.pop(result.episode_id, None)))
        if len(self.ended) >= self.batch:
            self.flush()

    def flush(self) -> None:
        ended, self.ended = self.ended, []
        if ended:
            self.store.end_episodes(ended)
