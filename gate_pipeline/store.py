"""The run store: episodes played under orchestration, kept so another process can grade them.

Persistence only: it plays nothing and grades nothing. `StoreSink` (an engine sink) writes
an episode's row when it opens, and when it ends, in one transaction, its ledger, how it
ended and its final warehouse (the SQLite image, a row of the `warehouses` table): everything
an episode leaves is in the database, so any machine with the database's URL (and the store's
key) can grade, verify and report it.

Stored data is verified, never trusted. When an episode ends its row records the case's
SHA-256, the ledger's length and last hash, the warehouse image's SHA-256 (and, for an agent that
keeps one, its conversation's: the `transcripts` table), and a seal: an HMAC-SHA256 over all of
these, the agent and how the episode ended, under the store's key (`store_key`: GATE_STORE_KEY,
else the file GATE_STORE_KEY_FILE names, else a random key made once in GATE_HOME/store.key,
readable by its owner only; 32 or more bytes of text, or one StoreError). The store records an id
of its key, so a writer with another key is refused. `load` checks every one of them and lists
what does not hold in `StoredEpisode.problems`; the grader grades such an episode 0 with those
reasons, and `gate verify` prints them. Whoever can edit the database but not read the key
cannot make an edit that passes: keep the key apart from the database (docs/integrity.md).

Each run records a manifest when it starts (`seal_run`: the episodes it must produce), sealed
again as complete with the episodes that count (`complete_run`), or as stopped or died
(`close_run`; `close_dead_runs` closes, with their open episodes, the runs whose process held a
lock under GATE_HOME and is gone). `load` gives a `StoredEpisode` back for the grader
(`grader.grade_stored`); grades are kept once per episode, with a sequence number, so a consumer
(the grading sensor) can emit each one once across restarts. Nightly summaries are kept too, as
the scoreboard's history. Kept grades and summaries are caches `gate verify` recomputes. The
database is any SQLAlchemy URL (default a SQLite file in GATE_HOME; `postgresql+psycopg://...`
for a PostgreSQL server that several machines share). Dagster's step outputs of the nightly job
can be kept here too (`put_output`/`get_output`, used by the Dagster project's IO manager), so a
step on another machine reads what the step before it wrote.

Schema 6 (this one) keeps each case's JSON once, in the `cases` table under its SHA-256 (the hash an
episode's row records and its seal covers), where schema 5 kept a copy in every episode's row: a night
plays each case once per agent, and every night the same cases. Schema 5 added agent names, transcripts,
manifests and the key's id to schema 4, which kept warehouses in the database. A schema-3 store
(warehouse files under GATE_HOME/warehouses), a schema-4 or a schema-5 store is migrated when first
opened; the rows stored before keep their case in their row, and every row's seal still holds.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import sqlite3
import stat
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterable, Mapping

from sqlalchemy import (
    Column,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    cast,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import (
    IntegrityError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)

from .kernel.cases import Case, CaseError, load_case
from .kernel.engine import EpisodeStart, Sink
from .kernel.errors import GateError
from .kernel.files import open_regular, path_state, read_bytes
from .kernel.ledger import canonical_json, chain_intact, last_hash
from .kernel.records import ABANDONED, EpisodeResult, Grade, StoredEpisode, log_text
from .kernel.sandbox import CAUGHT, Sandbox
from .kernel.settings import Settings, given_path, resolved_path
from .kernel.suite import MART_SQL, suites
from .kernel.world import revenue_of

SCHEMA_VERSION = "6"
# 3: warehouses as files under GATE_HOME; 4: no agent names, transcripts or manifests; 5: a case's JSON in every row
MIGRATES_FROM = ("3", "4", "5")
KEY_FILE = "store.key"
KEY_MIN_BYTES, KEY_MAX_BYTES = 32, 4096
KEY_HINT = "make one with: python3 -c 'import secrets; print(secrets.token_hex(32))'"
LOCKS = "locks"  # GATE_HOME/locks/<run id>.lock: held by the process playing a night, free once it is gone
CREATE_ATTEMPTS = 20
CONNECT_TIMEOUT_S = 10  # an unreachable database server is one error after this, not a hang
MAX_WAREHOUSE_FILE = 4 * 2**30  # a schema-3 warehouse file migrated into the database: at most this
RUNNING, ENDED = "running", "ended"
NEVER_ENDED = "the episode never ended"
OPEN, COMPLETE, STOPPED, DIED = "open", "complete", "stopped", "died"  # a sealed run's status
NIGHTLY = "nightly"  # a night's manifest kind (a `gate run`'s is "run", a Dagster case's "case")
CONTINUATION, API = "continuation", "api"  # manifest kinds besides a night's, a `gate run`'s, a Dagster case's
MAX_SLOTS = 10_000_000  # episodes a manifest may ask for (cases x agents x rollouts): more is not a manifest gate wrote
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
    Column("agent", Text, nullable=False),  # open-ended (module:Class, careful@variant, model names)
    Column("agent_options", Text, nullable=False),
    Column("case_json", Text, nullable=False),  # "" since schema 6: the case is in `cases`, under case_sha256
    Column("case_sha256", String(64), nullable=False),
    Column("warehouse", Text, nullable=False),  # the warehouse's name (its image is in `warehouses`)
    Column("warehouse_sha256", String(64)),
    Column("status", String(16), nullable=False),
    Column("end_reason", String(32)),
    Column("error", Text),
    Column("ledger_digest", String(64)),
    Column("ledger_entries", Integer),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("seal", String(64)),  # HMAC of the fields in SEALED (and SEALED_SINCE_5), under the store's key
    Column("agent_name", Text),  # the name the agent was resolved by (`agent` is its identity); schema 5
    Column("transcript_sha256", String(64)),  # the agent's own log (a model's conversation), when it keeps one
)
# what an ended episode's seal covers; a row of schema 5 with an agent name or a transcript also SEALED_SINCE_5
SEALED = ("episode_id", "run_id", "rollout", "case_id", "agent", "agent_options", "case_sha256", "warehouse",
          "warehouse_sha256", "status", "end_reason", "error", "ledger_digest", "ledger_entries")
SEALED_SINCE_5 = ("agent_name", "transcript_sha256")
cases = Table(  # each case's JSON (sorted keys) once, under its SHA-256; schema 6
    "cases", _meta,
    Column("case_sha256", String(64), primary_key=True),
    Column("case_json", Text, nullable=False),
)
ledger_rows = Table(
    "ledger_entries", _meta,
    Column("episode_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("entry", Text, nullable=False),
)
warehouses = Table(
    "warehouses", _meta,
    Column("episode_id", String(64), primary_key=True),
    Column("image", LargeBinary, nullable=False),  # the episode's final SQLite database, serialized
)
transcripts = Table(  # what an agent said about its episode (a model's messages and tool calls), JSON
    "transcripts", _meta,
    Column("episode_id", String(64), primary_key=True),
    Column("log", Text, nullable=False),
)
manifests = Table(  # sealed when a run starts: the episodes it must produce (`seal_run`)
    "manifests", _meta,
    Column("run_id", String(200), primary_key=True),
    Column("kind", String(16), nullable=False),  # nightly, run, case; continuation: a re-execution of `of`
    Column("body", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("episodes", Text),  # when complete: [[case_id, agent, rollout, episode_id], ...], the ones that count
    Column("created_at", Float, nullable=False),
    Column("closed_at", Float),
    Column("seal", String(64), nullable=False),
)
MANIFEST_SEALED = ("run_id", "kind", "body", "status", "episodes")
grades = Table(
    "grades", _meta,
    Column("grade_seq", Integer, primary_key=True, autoincrement=True),
    Column("episode_id", String(64), unique=True, nullable=False),
    Column("case_id", String(200), index=True, nullable=False),
    Column("agent", Text, nullable=False),
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
step_outputs = Table(  # Dagster step outputs of the nightly job (JSON), readable from any machine
    "step_outputs", _meta,
    Column("run_id", String(200), primary_key=True),
    Column("step_key", String(400), primary_key=True),
    Column("output", String(200), primary_key=True),
    Column("value", Text, nullable=False),
)


# the statements an episode's writes run, built once
_INSERT_EPISODES = insert(episodes)
_END_COLUMNS = ("status", "end_reason", "error", "ledger_digest", "ledger_entries", "ended_at", "warehouse_sha256",
                "transcript_sha256", "seal")
_END_EPISODES = update(episodes).where(episodes.c.episode_id == bindparam("key"), episodes.c.status == RUNNING)
_WRITES = {"new": (_INSERT_EPISODES, None), "end": (_END_EPISODES, _END_COLUMNS),
           "images": (insert(warehouses), None), "logs": (insert(transcripts), None)}
# (dialect, driver, parameter style): each write's SQL, fixed values, order
_COMPILED: dict[tuple[str, str, str], dict[str, tuple[str, dict, list | None]]] = {}


def _new_cases(dialect_name: str):
    """The INSERT of cases on the databases that have an upsert (SQLite, PostgreSQL; None elsewhere, where an
    episode's row keeps its case itself, as schema 5's did). A case already stored under its hash (another
    process may store the same case at the same time) is left as it is when it holds the same text, and given
    the case's text when it holds anything else: a row put there before the case was first played (whoever can
    edit the database can write any text under a hash) would otherwise fail every episode of the case."""
    if dialect_name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as upsert
    elif dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert  # type: ignore[assignment]
    else:
        return None
    stmt = upsert(cases)
    return stmt.on_conflict_do_update(index_elements=[cases.c.case_sha256],
                                      set_={"case_json": stmt.excluded.case_json},
                                      where=cases.c.case_json.is_distinct_from(stmt.excluded.case_json))


def _has_an_end(row) -> bool:
    """Whether an episode row holds anything only its end writes (a row still running holds none of it)."""
    return any(row[k] is not None for k in _END_COLUMNS if k != "status")


LEDGER_ROWS = ("episode_id", "seq", "entry")
LEDGER_AT_ONCE = 64  # ledger entries one INSERT writes (three parameters each): an episode's, mostly
# (dialect, driver, parameter style, rows): the INSERT of that many ledger entries, and its parameters' order
_LEDGER_INSERTS: dict[tuple[str, str, str, int], tuple[str, list[str] | None]] = {}


def _compiled_writes(dialect) -> dict[str, tuple[str, dict, list | None]]:
    """Each write of `end_episodes` compiled once for a dialect: its SQL text in the driver's parameter
    style, the values the statement fixes (the WHERE's status), and the parameters' order if positional."""
    key = (dialect.name, dialect.driver, dialect.paramstyle)  # two drivers of one database spell parameters apart
    known = _COMPILED.get(key)
    if known is None:
        known = {}
        writes = dict(_WRITES)
        new_cases = _new_cases(dialect.name)
        if new_cases is not None:
            writes["cases"] = (new_cases, None)
        for name, (stmt, keys) in writes.items():
            compiled = stmt.compile(dialect=dialect, column_keys=keys)
            order = list(compiled.positiontup or []) if compiled.positional else None
            fixed = {name: bind.effective_value for bind, name in compiled.bind_names.items() if not bind.required}
            known[name] = (compiled.string, fixed, order)
        _COMPILED[key] = known
    return known


def _ledger_insert(dialect, rows: int) -> tuple[str, list[str] | None]:
    """One INSERT of `rows` ledger entries (VALUES (...), (...)), compiled once per dialect and count: on
    PostgreSQL one statement in the pipeline instead of one per entry. Its parameters are named
    `<column>_m<row>`; the order is given where the driver's style is positional."""
    key = (dialect.name, dialect.driver, dialect.paramstyle, rows)
    known = _LEDGER_INSERTS.get(key)
    if known is None:
        compiled = insert(ledger_rows).values([dict.fromkeys(LEDGER_ROWS)] * rows).compile(dialect=dialect)
        known = _LEDGER_INSERTS[key] = (compiled.string, list(compiled.positiontup or []) if compiled.positional
                                        else None)
    return known


class StoreError(GateError):
    """The run store cannot be opened or read (bad URL, unwritable GATE_HOME, unknown episode)."""


NIGHTS_PAGE = 100  # kept summaries the history reads at a time (more than it shows, when it shows few: past edited ones)
WAL_PAGES = 1000  # SQLite's own checkpoint interval: the WAL is copied into the database every 1000 pages
HELD_WAL_PAGES = 10000  # while `holding`: once per chunk of a night (or every 10000 pages), when it ends


def _sqlite_reader_pragmas(dbapi_conn, _record) -> None:
    """A reader's (`gate verify`): the database as it is (its journal mode too: switching it rewrites the file's
    header), and no statement of the reader's may write."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA query_only=ON")
    cur.close()


def _replaced(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers (the sensor) never block the writer
    cur.execute("PRAGMA synchronous=NORMAL")  # a commit is in the WAL: kept if the process dies (docs/performance.md)
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
    cur.close()


def _postgresql_session(error: type[Exception]):
    """A PostgreSQL connection's settings: large values (a case's JSON, a warehouse image) compressed
    with lz4, not pglz (several times less of the server's time per episode; read back the same).
    A server without lz4 keeps its default."""
    def apply(dbapi_conn, _record) -> None:
        try:
            with dbapi_conn.cursor() as cur:
                cur.execute("SET default_toast_compression = lz4")
            dbapi_conn.commit()
        except error:
            dbapi_conn.rollback()
    return apply


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data).hexdigest()


MART_STEP_BUDGET = 50_000_000  # virtual-machine steps one read of a stored warehouse may take (a real mart: thousands)
MART_TIME_BUDGET_S = 5.0  # and seconds, compiling included


def _as_text(value) -> str:
    """A stored text field as text: "" for none, and a value of another type (a column edited into a BLOB or a
    number, which its row's seal then fails on) spelled as Python writes it, so that nothing reading it raises."""
    return "" if value is None else value if isinstance(value, str) else repr(value)


def read_mart(image: bytes | None, name: str, expected_sha256: str | None, sql: str = MART_SQL) -> float:
    """The revenue mart of a stored warehouse image, read from an in-memory copy only once the image is
    the one recorded (its SHA-256, which must be recorded: an image without one is not queried), and
    in the sandbox agent SQL runs in, with a budget of its own (MART_STEP_BUDGET steps, MART_TIME_BUDGET_S
    seconds): an image is stored data, and stored data can be hostile (a view over an
    endless recursive query). StoreError if it is missing, altered, unreadable or over the budget;
    KeyboardInterrupt if Ctrl-C came while it was read."""
    if image is None:
        raise StoreError(f"warehouse {name} is missing from the run store")
    if not expected_sha256:
        raise StoreError(f"warehouse {name} has no SHA-256 recorded: it is not read")
    if not isinstance(image, bytes) or sha256(image) != expected_sha256:  # (a BLOB edited into a number: altered)
        raise StoreError(f"warehouse {name} was altered (its SHA-256 differs from the one recorded)")
    conn = sqlite3.connect(":memory:", cached_statements=0)
    sandbox = None
    try:
        conn.deserialize(image)
        sandbox = Sandbox(conn, MART_STEP_BUDGET, MART_TIME_BUDGET_S, limits=(), schema_trusted=False)
        rows, _, _ = sandbox.execute(sql)
        return revenue_of(rows[0][0])
    except (*CAUGHT, TypeError, IndexError) as exc:
        if str(exc) == "interrupted" and sandbox is not None and sandbox.compile_refused:
            raise StoreError(f"warehouse {name} is unreadable (its mart's query was not compiled: a copy of its "
                             "schema cannot be rebuilt, or compiling the query outgrows the check's memory)") from None
        if str(exc) == "interrupted":
            raise StoreError(f"warehouse {name} is unreadable (its mart did not finish within "
                             f"{MART_STEP_BUDGET:,} steps or {MART_TIME_BUDGET_S:g} s)") from None
        raise StoreError(f"warehouse {name} is unreadable ({_first_line(exc)})") from None
    finally:
        conn.close()


def display_url(url: str) -> str:
    """A database URL as it may be printed: the password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can parse: hide what sits where a password would
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _key_text(raw: bytes, where: str) -> bytes:
    """A key as HMAC uses it: 32 to 4096 bytes of printable text (a trailing newline is not part of it)."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise StoreError(f"the store key {where} is not text (it holds bytes that are not UTF-8): a key is "
                         f"{KEY_MIN_BYTES} or more bytes of text; {KEY_HINT}") from None
    data = text.encode("utf-8")
    if not text.isprintable():
        raise StoreError(f"the store key {where} holds control characters: a key is {KEY_MIN_BYTES} or more bytes of "
                         f"printable text; {KEY_HINT}")
    if not KEY_MIN_BYTES <= len(data) <= KEY_MAX_BYTES:
        raise StoreError(f"the store key {where} is {len(data):,} bytes long: a key is {KEY_MIN_BYTES} to "
                         f"{KEY_MAX_BYTES:,} bytes of text; {KEY_HINT}")
    return data


def store_key(settings: Settings) -> tuple[bytes, str, Path | None]:
    """(the sealing key, where it came from, its file if it is one): GATE_STORE_KEY, else the file
    GATE_STORE_KEY_FILE (or `gate verify --key-file`) names, else GATE_HOME/store.key (made once,
    atomically, mode 0600). A key that is not 32 or more bytes of text is one StoreError."""
    if settings.store_key:
        try:
            raw = settings.store_key.encode("utf-8")
        except UnicodeEncodeError:
            raise StoreError(f"GATE_STORE_KEY is not text (it holds bytes that are not UTF-8): a key is "
                             f"{KEY_MIN_BYTES} or more bytes of text; {KEY_HINT}") from None
        return _key_text(raw, "in GATE_STORE_KEY"), "GATE_STORE_KEY", None
    if settings.store_key_file is not None:
        path = settings.store_key_file
        return _key_text(read_bytes(path, "store key file", KEY_MAX_BYTES + 2, StoreError), str(path)), str(path), path
    path = settings.home / KEY_FILE
    if not path.exists():
        try:
            tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # fails if another process made the key first: theirs is kept
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        except OSError as exc:
            raise StoreError(f"GATE_HOME {settings.home}: cannot make the store key ({exc.strerror or exc})") from None
    raw = read_bytes(path, "store key file", KEY_MAX_BYTES + 2, StoreError)
    try:
        return _key_text(raw, str(path)), str(path), path
    except StoreError as exc:
        raise StoreError(f"{exc} (if gate made it, it was altered: restore it or start a new GATE_HOME)") from None


def key_id(key: bytes) -> str:
    """What the store records of its key: enough to tell another key, nothing that gives this one away."""
    return hmac.new(key, b"gate run store key id", hashlib.sha256).hexdigest()[:32]


def _sqlite_file(url) -> Path | None:
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return resolved_path(given_path(url.database))


def _lock_fd(path: Path, flags: int) -> int:
    """A descriptor of the lock file at `path`; OSError when there is none, or what is there is no regular file
    (a FIFO, a socket, a device, a symbolic link: nothing gate makes), which is opened without waiting."""
    return open_regular(path, flags | os.O_NOFOLLOW)[0]


@contextmanager
def hold_lock(path: Path, holder: str):
    """Hold an exclusive lock on `path` while the block runs (it goes with the process, however the
    process ends: even kill -9). LockHeld, naming who holds it, when another process does; StoreError when
    what is at `path` is no lock file (a FIFO there once made the command wait for ever)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = _lock_fd(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise StoreError(f"{path}: cannot use it as a lock file ({exc.strerror or exc}); gate makes it, a regular "
                         f"file: remove what is there") from None
    with os.fdopen(fd, "r+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise LockHeld(fh.read().strip() or "another process") from None
        fh.seek(0)
        fh.truncate()
        fh.write(holder)
        fh.flush()
        try:
            yield
        finally:
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_free(path: Path) -> bool:
    """Whether nobody holds the lock at `path` (a missing file is nobody's lock: False). What is there but is no
    regular file (a FIFO, a socket, a device, a symbolic link) is no lock a process of gate's holds: free (it once
    read as held, and a running episode beside it as being played; a FIFO made the caller wait for ever)."""
    try:
        fd = _lock_fd(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        try:
            return not stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the descriptor releases the lock if it was taken
    return True


class LockHeld(GateError):
    """Another process holds the lock (its message: who)."""


# (store URL, key id) of the stores this process has created or checked the tables of, and found sealed
# with its key: a process opens its store many times (the nightly: each step, each step output)
_READY: set[tuple[str, str]] = set()
_ENGINES: dict[tuple[int, str], Engine] = {}  # (process, store URL): the engine the stores opened `once` share
SHARED_ENGINES = 4


class RunStore:
    """Episodes, their ledgers and grades, and nightly summaries, under one GATE_HOME."""

    def __init__(self, settings: Settings | None = None, check_key: bool = True, once: bool = False):
        """Open (or create) the store. With `check_key` (every writer) a key other than the one the store
        was sealed with is a StoreError; without it (`gate verify`) the store is opened to be read only:
        nothing is created, migrated or recorded (a store that lacks a table or a column, needs migrating
        or has no key file is one StoreError), and `key_problem` says if the key is not the store's. With `once`,
        a store this process has already opened with the same key is not checked again (its tables,
        schema and key), and the stores opened `once` share one engine and its connections (which
        `dispose` leaves open): the Dagster resource opens its store at every step and step output."""
        settings = settings or Settings.from_env()
        self.home = settings.home
        self.url = display_url(settings.store_url)  # for messages: never the password
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"GATE_HOME {self.home}: cannot create it ({exc.strerror or exc})") from None
        try:
            url = make_url(settings.store_url)
            connect = {"connect_timeout": CONNECT_TIMEOUT_S} if url.get_backend_name() == "postgresql" else {}
        except (SQLAlchemyError, ValueError, ImportError) as exc:
            raise StoreError(f"run store URL {self.url!r}: {_first_line(exc)}") from None
        shared = (os.getpid(), settings.store_url)
        self._shared = once
        if once and shared in _ENGINES:  # its connections too (a PostgreSQL login is most of an open)
            self.engine = _ENGINES[shared]
        else:
            try:
                self.engine = create_engine(url, connect_args=connect, pool_pre_ping=bool(connect))
            except (SQLAlchemyError, ValueError, ImportError) as exc:
                raise StoreError(f"run store URL {self.url!r}: {_first_line(exc)}") from None
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "connect", _sqlite_pragmas if check_key else _sqlite_reader_pragmas)
            elif self.engine.dialect.driver == "psycopg":
                event.listen(self.engine, "connect", _postgresql_session(self.engine.dialect.loaded_dbapi.Error))
            if once:
                for inherited in [k for k in _ENGINES if k[0] != shared[0]]:
                    del _ENGINES[inherited]  # a parent's, before this process forked: never closed from here
                while len(_ENGINES) >= SHARED_ENGINES:  # a process plays a store or two: the oldest's pool closed
                    _ENGINES.pop(next(iter(_ENGINES))).dispose()
                _ENGINES[shared] = self.engine
        database = _sqlite_file(url)
        if not check_key and not (settings.store_key or settings.store_key_file is not None
                                  or (settings.home / KEY_FILE).exists()):  # a reader makes no key
            raise StoreError(f"run store {self.url}: no store key at {settings.home / KEY_FILE} (nor GATE_STORE_KEY, "
                             f"GATE_STORE_KEY_FILE, --key-file): its seals cannot be checked")
        self.key, self.key_source, key_file = store_key(settings)
        if not check_key:
            self._check_readable(database)
        # a key that whoever can rewrite the database can rewrite too proves nothing against them
        # (judged from the database's path as given, not as resolved: a link there leads elsewhere, but whoever can
        # write its folder can point it at a database of theirs)
        self.key_beside = key_file if (key_file is not None and database is not None
                                       and _beside(key_file, given_path(url.database))) else None
        ready = (settings.store_url, key_id(self.key))
        if once and check_key and ready in _READY:  # this process made or checked the tables and the key
            self.key_problem = None
        elif not check_key:  # read only: the tables were checked above, the key's id is only compared
            self.key_problem = self._compare_key()
        else:
            self._create()
            self.key_problem = self._check_key(check_key)
            if self.key_problem is None:
                _READY.add(ready)
        self._cases: dict[int, tuple[Case, str, str]] = {}
        self._stored_cases: set[str] = set()  # the hashes of cases this process saw committed to `cases`
        self._dedup = _new_cases(self.engine.dialect.name) is not None  # cases kept in `cases`, not in each row
        self._held: Connection | None = None  # the connection `holding` took
        self._pipe = None  # its psycopg pipeline, on PostgreSQL

    def _check_readable(self, database: Path | None) -> None:
        """For a reader that changes nothing (`gate verify`): the store exists, at this schema, with every
        table and column this gate reads; else one StoreError."""
        where = f"run store {self.url}"
        if database is not None and path_state(database) != "file":
            raise StoreError(f"no {where}: nothing was stored under it yet")
        try:
            with self.engine.connect() as c:
                have = set(inspect(c).get_table_names())
                # an older schema lacks this one's tables: said as a store to migrate, before what it lacks
                version = c.execute(select(store_meta.c.value).where(store_meta.c.key == "schema")).scalar() \
                    if store_meta.name in have else None
                if version in MIGRATES_FROM:
                    raise StoreError(f"{where} has schema {version}: the first command that writes to it (gate "
                                     f"nightly, gate run) migrates it to {SCHEMA_VERSION}; a reader changes nothing")
                missing = [t.name for t in _meta.sorted_tables if t.name not in have]
                if missing:
                    raise StoreError(f"{where} lacks the table{'s' if len(missing) > 1 else ''} "
                                     f"{', '.join(missing)}: it is not a gate run store of schema {SCHEMA_VERSION} "
                                     f"(a reader changes nothing; a command that writes would create {'them' if len(missing) > 1 else 'it'})")
                if version != SCHEMA_VERSION:
                    raise StoreError(f"{where} has schema {version}; this gate reads {SCHEMA_VERSION}")
                for table in _meta.sorted_tables:
                    columns = {col["name"] for col in inspect(c).get_columns(table.name)}
                    lacking = [col.name for col in table.columns if col.name not in columns]
                    if lacking:
                        raise StoreError(f"{where}: its table {table.name} lacks the column {lacking[0]}: it is not "
                                         f"a gate run store of schema {SCHEMA_VERSION}")
        except SQLAlchemyError as exc:
            raise StoreError(f"{where}: {_first_line(exc)}") from None

    def _compare_key(self) -> str | None:
        """What is wrong with the key for a reader (None: it is the store's); nothing is recorded."""
        try:
            with self.engine.connect() as c:
                kept = c.execute(select(store_meta.c.value).where(store_meta.c.key == "key_id")).scalar()
        except SQLAlchemyError as exc:
            raise StoreError(f"run store {self.url}: {_first_line(exc)}") from None
        if kept is None:
            return (f"{self.url} records no id of the key it was sealed with (every store that gate writes records "
                    f"one): whether the store key ({self.key_source}) is its key cannot be told")
        if kept == key_id(self.key):
            return None
        return (f"the store key ({self.key_source}) is not the key {self.url} was sealed with: every seal it "
                f"checks fails")

    def _check_key(self, strict: bool) -> str | None:
        """Record the key's id in a store that has none; say (or raise, when `strict`) if it is another key."""
        mine = key_id(self.key)
        query = select(store_meta.c.value).where(store_meta.c.key == "key_id")
        with self.engine.connect() as c:
            kept = c.execute(query).scalar()
        if kept is None:
            try:
                with self.engine.begin() as c:
                    c.execute(insert(store_meta).values(key="key_id", value=mine))
            except IntegrityError:  # another process recorded it first: theirs is the store's
                pass
            with self.engine.connect() as c:
                kept = c.execute(query).scalar()
        if kept == mine:
            return None
        problem = (f"the store key ({self.key_source}) is not the key {self.url} was sealed with: every seal it "
                   f"checks fails")
        if strict:
            raise StoreError(f"{problem}; give this process the store's key (GATE_STORE_KEY or GATE_STORE_KEY_FILE)")
        return problem

    def _create(self) -> None:
        """Make the tables if they are missing; any number of processes may do this at once on a new
        store (one of them creates each table, the others find it there)."""
        for attempt in range(CREATE_ATTEMPTS):
            try:
                _meta.create_all(self.engine)
                self._check_version()
                return
            except StoreError:
                raise
            except (OperationalError, IntegrityError, ProgrammingError) as exc:
                text = str(exc).lower()
                if attempt + 1 < CREATE_ATTEMPTS and ("already exists" in text or "locked" in text
                                                      or "duplicate" in text or "unique" in text):
                    time.sleep(0.02 * (attempt + 1))
                    continue
                raise StoreError(f"run store {self.url!r}: {_first_line(exc)}") from None
            except SQLAlchemyError as exc:
                raise StoreError(f"run store {self.url!r}: {_first_line(exc)}") from None

    def _check_version(self) -> None:
        with self.engine.begin() as c:
            version = c.execute(select(store_meta.c.value).where(store_meta.c.key == "schema")).scalar()
            if version is None:
                c.execute(insert(store_meta).values(key="schema", value=SCHEMA_VERSION))
            elif version in MIGRATES_FROM:
                self._migrate(c, version)
            elif version != SCHEMA_VERSION:
                raise StoreError(f"run store {self.url} has schema {version}; this gate reads {SCHEMA_VERSION}: "
                                 f"move it away or set GATE_HOME / GATE_DB_URL to a new place")

    def _migrate(self, c, version: str) -> None:
        """Schema 3, 4 or 5 to 6, by the first process to claim the version, in the same transaction.
        3 to 4: copy each ended episode's warehouse file under GATE_HOME into the database (a missing
        file stays missing: reading the episode says so). 4 to 5: the episodes' agent names and
        transcript hashes (empty for what was stored before; their seals still hold). 5 to 6: the
        `cases` table (made with the others); the episodes stored before keep their case in their row."""
        claimed = c.execute(update(store_meta).where(store_meta.c.key == "schema", store_meta.c.value == version)
                            .values(value=SCHEMA_VERSION)).rowcount
        if claimed != 1:
            return
        if version == "3":
            done = set(c.execute(select(warehouses.c.episode_id)).scalars())
            for episode_id, name in c.execute(select(episodes.c.episode_id, episodes.c.warehouse)
                                              .where(episodes.c.warehouse_sha256.is_not(None))).all():
                image = self._migrated_warehouse(name)
                if image is None:
                    continue
                if episode_id not in done:
                    c.execute(insert(warehouses).values(episode_id=episode_id, image=image))
        have = {col["name"] for col in inspect(c).get_columns("episodes")}
        for column, kind in (("agent_name", "TEXT"), ("transcript_sha256", "VARCHAR(64)")):
            if column not in have:
                c.execute(sql_text(f"ALTER TABLE episodes ADD COLUMN {column} {kind}"))

    def _migrated_warehouse(self, name) -> bytes | None:
        """The bytes of a schema-3 episode's warehouse file, which the row names: only a regular file under GATE_HOME
        (a stored row is anyone's to edit: a name that leads elsewhere, to a FIFO or to /dev/zero, is no warehouse
        file), up to MAX_WAREHOUSE_FILE; else None (the episode's warehouse stays missing, as a missing file's)."""
        if not isinstance(name, str) or not name:
            return None
        path = self.home / name
        try:
            if not path.resolve().is_relative_to(self.home.resolve()):
                return None
            return read_bytes(path, "warehouse file", MAX_WAREHOUSE_FILE, StoreError)
        except (StoreError, OSError, RuntimeError, ValueError):
            return None

    def seal(self, row: dict) -> str:
        """The HMAC of an episode row's sealed fields, under the store's key."""
        fields = [row.get(k) for k in SEALED]
        if any(row.get(k) is not None for k in SEALED_SINCE_5):
            fields += [row.get(k) for k in SEALED_SINCE_5]
        return self._hmac(fields)

    def _hmac(self, fields: list) -> str:
        # a field of a type gate never stores (bytes: a column edited into a BLOB) is spelled by its type and value:
        # the seal then matches nothing gate wrote, so the row reads as altered (it raised TypeError here)
        text = json.dumps(fields, ensure_ascii=True, default=lambda v: [type(v).__name__, repr(v)])
        return hmac.new(self.key, text.encode("ascii"), hashlib.sha256).hexdigest()

    def dispose(self) -> None:
        if not self._shared:  # a shared engine (`once`) keeps its connections for the process's next open
            self.engine.dispose()

    # -- writing an episode (StoreSink calls these) ---------------------------------------------
    @contextmanager
    def holding(self):
        """Episodes written while this block runs go through one connection, taken once (not one from
        the pool, checked with a round trip on PostgreSQL, per transaction): a night's chunk. On
        PostgreSQL (psycopg) the connection stays in pipeline mode while the block runs, so each
        transaction's statements and its COMMIT go to the server together: one round trip each."""
        if self._held is not None:
            yield self
            return
        with self.engine.connect() as conn:
            raw = conn.connection.driver_connection
            sqlite = raw if self.engine.dialect.name == "sqlite" else None
            if sqlite is not None:  # the WAL copied into the database once, at the end, not every 1000 pages
                sqlite.execute(f"PRAGMA wal_autocheckpoint={HELD_WAL_PAGES}")
            try:
                with self._pipeline(raw) as pipe:
                    self._held, self._pipe = conn, pipe
                    yield self
            finally:
                self._held = self._pipe = None
                if sqlite is not None:
                    try:
                        sqlite.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
                        sqlite.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error:  # busy or closed: SQLite checkpoints at the next commit past WAL_PAGES
                        pass

    def _pipeline(self, raw):
        """psycopg's pipeline mode on the driver's connection `raw` (nothing elsewhere, or where one is on):
        what is sent in it goes to the server without waiting for each answer; a sync (a COMMIT, or the
        block's end) waits for them all and raises the first error."""
        if self.engine.dialect.driver != "psycopg" or raw.pgconn.pipeline_status:
            return nullcontext()
        return raw.pipeline()

    def _drain(self) -> None:
        """After an error inside `holding`'s pipeline: read the answers still due (each an error now), so
        the transaction's ROLLBACK can be sent; the error itself was raised already."""
        if self._pipe is not None:
            try:
                self._pipe.sync()
            except self.engine.dialect.loaded_dbapi.Error:
                pass

    @contextmanager
    def _batched(self):
        """A transaction for an episode's writes, as a function `write(name, rows)` that runs each one
        (`_WRITES`) compiled once, on the driver's cursor (none of SQLAlchemy's work per statement). On
        PostgreSQL (psycopg) the statements go in one pipeline, so an episode's writes cost one round trip
        and COMMIT another, not one each (in `holding`, one for both); an error in any of them is raised
        before the commit completes, so nothing of the transaction is kept."""
        writes = _compiled_writes(self.engine.dialect)

        def write(cursor, name: str, rows: list[dict]) -> None:
            if name == "ledger":
                for start in range(0, len(rows), LEDGER_AT_ONCE):
                    part = rows[start:start + LEDGER_AT_ONCE]
                    sql, order = _ledger_insert(self.engine.dialect, len(part))
                    values = {f"{k}_m{i}": row[k] for i, row in enumerate(part) for k in LEDGER_ROWS}
                    cursor.execute(sql, values if order is None else tuple(values[k] for k in order))
                return
            sql, fixed, order = writes[name]
            if order is None:
                cursor.executemany(sql, [{**fixed, **row} for row in rows])
            else:
                cursor.executemany(sql, [tuple(row[k] if k in row else fixed[k] for k in order) for row in rows])

        held = self._held
        with (nullcontext(held) if held is not None else self.engine.connect()) as c:
            with c.begin():
                raw = c.connection.driver_connection
                with self._pipeline(raw):
                    cursor = c.connection.cursor()
                    try:
                        yield lambda name, rows: write(cursor, name, rows)
                        if self._pipe is not None:  # COMMIT sent in the pipeline (the block's own commit is then
                            raw.commit()  # a no-op): an error in any statement is raised here, and rolled back
                    except BaseException:
                        self._drain()
                        raise
                    finally:
                        cursor.close()

    def warehouse_name(self, case_id: str, episode_id: str) -> str:
        """An episode's warehouse name (sealed with its row; a schema-3 store kept the file there)."""
        return f"warehouses/{_UNSAFE.sub('_', case_id)}/{episode_id}.sqlite"

    def _case_text(self, case: Case) -> tuple[str, str]:
        """The case as stored (sorted JSON) and its SHA-256, made once per case object: the agents and
        rollouts of a case share them."""
        known = self._cases.get(id(case))
        if known is None or known[0] is not case:
            if len(self._cases) > 4096:
                self._cases.clear()
            text = json.dumps(case.data, sort_keys=True)
            known = self._cases[id(case)] = (case, text, sha256(text))
        return known[1], known[2]

    def _row(self, start: EpisodeStart) -> dict:
        case_json, case_sha256 = self._case_text(start.case)
        return {"episode_id": start.episode_id, "run_id": start.run_id, "rollout": start.rollout,
                "case_id": start.case.case_id, "agent": start.agent,
                "agent_options": json.dumps(start.options, sort_keys=True, default=repr),
                "case_json": "" if self._dedup else case_json, "case_sha256": case_sha256,
                "warehouse": self.warehouse_name(start.case.case_id, start.episode_id),
                "warehouse_sha256": None, "status": RUNNING, "started_at": start.started_at, "end_reason": None,
                "error": None, "ledger_digest": None, "ledger_entries": None, "ended_at": None, "seal": None,
                "agent_name": start.agent_name or start.agent, "transcript_sha256": None}

    def _case_rows(self, starts: list[EpisodeStart]) -> list[dict]:
        """The `cases` rows of these episodes' cases that this process has not seen committed (none where each
        episode's row keeps its case), in the order of their hashes: two transactions storing the same cases at
        once on PostgreSQL (the second waits for the first, then writes the case's text over a row holding other
        text, or leaves it) take them in one order, so neither waits for the other while holding what the other waits for."""
        if not self._dedup:
            return []
        out: dict[str, dict] = {}
        for start in starts:
            text, digest = self._case_text(start.case)
            if digest not in self._stored_cases:
                out[digest] = {"case_sha256": digest, "case_json": text}
        return [out[digest] for digest in sorted(out)]

    def _committed(self, case_rows: list[dict]) -> None:
        if len(self._stored_cases) > 65536:
            self._stored_cases.clear()
        self._stored_cases.update(row["case_sha256"] for row in case_rows)

    def start_episode(self, start: EpisodeStart) -> dict:
        """Keep an episode's row as it opens (running); returns the row, for `end_episodes`' `announced`."""
        row = self._row(start)
        case_rows = self._case_rows([start])
        with self._batched() as write:
            if case_rows:
                write("cases", case_rows)
            write("new", [row])
        self._committed(case_rows)
        return row

    def end_episode(self, result: EpisodeResult, start: EpisodeStart | None = None) -> None:
        """Keep an ended episode (see `end_episodes`)."""
        self.end_episodes([(result, start)])

    def end_episodes(self, ended: list[tuple[EpisodeResult, EpisodeStart | None]],
                     opening: EpisodeStart | None = None, announced: dict[str, dict] | None = None) -> dict | None:
        """Keep ended episodes, in one transaction: each one's ledger, how it ended (with the chain's
        last hash and length, to check the stored ledger against later) and its final warehouse;
        with its row, when its start is given (an episode that was not announced when it opened).
        `announced` holds the rows `start_episode` kept (else they are read back); `opening`, an
        episode opening now, is kept as running in the same transaction (its row is returned)."""
        known = announced or {}
        unread = [r.episode_id for r, start in ended if start is None and r.episode_id not in known]
        rows = {k: known[k] for k in (r.episode_id for r, start in ended if start is None) if k in known}
        if unread:
            with self.engine.connect() as c:
                rows.update({r["episode_id"]: dict(r) for r in c.execute(
                    select(episodes).where(episodes.c.episode_id.in_(unread))).mappings()})
        new, updates, ledgers, images, logs = [], [], [], [], []
        opened = self._row(opening) if opening is not None else None
        case_rows = self._case_rows([start for _, start in ended if start is not None]
                                    + ([opening] if opening is not None else []))
        for result, start in ended:
            end = {"status": ENDED, "end_reason": result.end_reason, "error": result.error or None,
                   "ledger_digest": last_hash(result.ledger), "ledger_entries": len(result.ledger),
                   "ended_at": time.time(), "warehouse_sha256": None, "transcript_sha256": None}
            if result.warehouse is not None:
                images.append({"episode_id": result.episode_id, "image": result.warehouse})
                end["warehouse_sha256"] = sha256(result.warehouse)
            if result.agent_log:
                log = log_text(result.agent_log)
                logs.append({"episode_id": result.episode_id, "log": log})
                end["transcript_sha256"] = sha256(log)
            if start is not None:
                row = {**self._row(start), **end}
                new.append({**row, "seal": self.seal(row)})
            elif result.episode_id in rows:
                row = {**rows[result.episode_id], **end}
                updates.append({"key": result.episode_id, **end, "seal": self.seal(row)})
            ledgers += [{"episode_id": result.episode_id, "seq": e["seq"], "entry": canonical_json(e)}
                        for e in result.ledger]  # json.dumps(e, sort_keys=True), its encoder built once
        with self._batched() as write:
            for name, batch in (("cases", case_rows), ("new", new), ("end", updates), ("ledger", ledgers),
                                ("images", images), ("logs", logs), ("new", [opened] if opened is not None else [])):
                if batch:
                    write(name, batch)
        self._committed(case_rows)
        return opened

    def close_abandoned(self, episode_id: str, reason: str) -> bool:
        """End an episode whose process died before it did (its warehouse may never have been
        written); it grades 0 with `reason`. False if it had already ended."""
        with self.engine.begin() as c:
            row = c.execute(select(episodes).where(episodes.c.episode_id == episode_id,
                                                   episodes.c.status == RUNNING)).mappings().first()
            if row is None or _has_an_end(row):  # ended, or a row altered to look running: left as it is
                return False  # (a running row has no seal yet: what the run's manifest names is checked by verify)
            end = {"status": ENDED, "end_reason": ABANDONED, "error": reason, "ended_at": time.time()}
            done = c.execute(update(episodes).where(episodes.c.episode_id == episode_id,
                                                    episodes.c.status == RUNNING)
                             .values(**end, seal=self.seal({**dict(row), **end})))
        return done.rowcount == 1

    # -- reading ------------------------------------------------------------------------------
    def _rows(self, query) -> list[dict]:
        """The rows of a read of what the store keeps (episodes, ledgers, transcripts, grades, manifests, summaries,
        step outputs). SQLite keeps whatever bytes an edit of its file writes as text, and its driver raises on
        those that are not UTF-8, which would stop the reader at one row: such a read is made again with them
        decoded as U+FFFD, text gate never wrote (the row's seal or hash then fails: a named problem) that can
        still be passed back as a parameter."""
        with self.engine.connect() as c:
            try:
                return [dict(r) for r in c.execute(query).mappings().all()]
            except OperationalError as exc:
                raw = c.connection.driver_connection
                if not isinstance(raw, sqlite3.Connection) or "Could not decode to UTF-8" not in str(exc):
                    raise
                c.rollback()
                raw.text_factory = _replaced
                try:
                    return [dict(r) for r in c.execute(query).mappings().all()]
                finally:
                    raw.text_factory = str

    def episode(self, episode_id: str) -> dict:
        rows = self._rows(select(episodes).where(episodes.c.episode_id == episode_id))
        if not rows:
            raise StoreError(f"no episode {episode_id!r} in {self.url}")
        return rows[0]

    def count_episodes(self, status: str | None = None) -> int:
        query = select(func.count()).select_from(episodes)
        if status is not None:
            query = query.where(episodes.c.status == status)
        with self.engine.connect() as c:
            return int(c.execute(query).scalar_one())

    def episodes(self, run_id: str | None = None, status: str | None = None) -> list[dict]:
        """Episode rows, oldest first, optionally of one run and in one status."""
        query = select(episodes).order_by(episodes.c.started_at)
        if run_id is not None:
            query = query.where(episodes.c.run_id == run_id)
        if status is not None:
            query = query.where(episodes.c.status == status)
        return self._rows(query)

    def entries(self, episode_id: str) -> list[dict]:
        """The stored ledger (a row that does not parse is left out; `load` says so)."""
        return self._entries(episode_id)[0]

    def _entries(self, episode_id: str) -> tuple[list[dict], list[str]]:
        rows = self._rows(select(ledger_rows.c.seq, ledger_rows.c.entry).where(ledger_rows.c.episode_id == episode_id)
                          .order_by(ledger_rows.c.seq))
        entries, problems = [], []
        for seq, text in ((r["seq"], r["entry"]) for r in rows):
            try:
                entry = json.loads(text)
            except (ValueError, RecursionError, TypeError):
                problems.append(f"ledger entry {seq} is not readable JSON")
                continue
            entries.append(entry)
        return entries, problems

    def _case_json(self, case_sha256):
        """A case's JSON as `cases` keeps it under its SHA-256, or None. An edited row may hold anything (bytes, a
        number), which then fails the case's hash. On SQLite the value is read as bytes (`load` hashes them, and
        decodes them only once they are the case recorded): text that is not UTF-8 there would make SQLite's driver
        raise with the whole text in its message, and a read as U+FFFD take twice its size again, for a case
        planted under the hash that may be of any size."""
        if not isinstance(case_sha256, str):
            return None
        column = cast(cases.c.case_json, LargeBinary) if self.engine.dialect.name == "sqlite" else cases.c.case_json
        with self.engine.connect() as c:
            return c.execute(select(column).where(cases.c.case_sha256 == case_sha256)).scalar()

    def _transcript_text(self, episode_id: str) -> str | None:
        rows = self._rows(select(transcripts.c.log).where(transcripts.c.episode_id == episode_id))
        return rows[0]["log"] if rows else None

    def transcript(self, episode_id: str) -> dict | None:
        """What the agent said about its episode (a model: its messages and tool calls), as stored; None if it
        keeps nothing, or the text does not parse (`load` checks it against its hash)."""
        text = self._transcript_text(episode_id)
        try:
            log = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            return None
        return log if isinstance(log, dict) else None

    def warehouse_image(self, episode_id: str) -> bytes | None:
        """An episode's final warehouse as stored (a SQLite database image), or None."""
        with self.engine.connect() as c:
            return c.execute(select(warehouses.c.image).where(warehouses.c.episode_id == episode_id)).scalar()

    def load(self, episode_id: str) -> StoredEpisode:
        """The episode as stored, checked: its seal, its case against the case's hash, its ledger
        (readable, its chain intact, as long and ending on the hash recorded when it ended) and its
        warehouse image against its hash. Whatever does not hold is listed in `problems`."""
        row = self.episode(episode_id)
        problems: list[str] = []
        if row["status"] != ENDED and _has_an_end(row):
            problems.append("the episode's record was altered (it holds what an ended episode records, and a "
                            "status that says it never ended)")
        elif row["status"] != ENDED:
            problems.append(NEVER_ENDED)
        elif not isinstance(row["seal"], str) or not row["seal"].isascii() or not row["seal"] \
                or not hmac.compare_digest(row["seal"], self.seal(row)):  # compare_digest refuses other text
            problems.append("the episode's record was altered (its seal does not match)")
        case = None
        sealed = not problems  # its record as gate sealed it (an ended episode whose seal matches)
        case_json = row["case_json"] or self._case_json(row["case_sha256"])  # in its row, as schema 5 kept it
        held = isinstance(case_json, (str, bytes)) and sha256(case_json) == row["case_sha256"]
        undecoded = False
        if held and isinstance(case_json, bytes):  # the bytes of the case recorded: its UTF-8 (unless its hash and
            try:  # the row's seal were forged together, by whoever holds the key)
                case_json = case_json.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                held, undecoded = False, True
        if case_json is None:
            problems.append("the episode's case is missing from the run store")
        elif undecoded:
            problems.append("the stored case is not UTF-8 text")
        elif not held:  # not parsed: what is not the case recorded is not read as one (a planted one may be huge)
            problems.append("the stored case was altered (its SHA-256 differs from the one recorded)")
        try:
            case = json.loads(case_json) if held else None
            options = json.loads(row["agent_options"])
        except (ValueError, RecursionError, TypeError):
            problems.append("the stored case or agent options are not readable JSON")
            options = {}
        if case is not None:
            try:
                case = load_case(case, "the stored case")
            except CaseError as exc:
                problems.append(f"the stored case is not a case gate can play ({exc})")
                case = None
        entries, unreadable = self._entries(episode_id)
        problems += unreadable
        intact = sealed and not problems  # its record, case and ledger entries as gate wrote them, so far
        # an episode that ended in its process recorded its ledger and warehouse (one cut off there too);
        # one closed because its process died has neither
        recorded = row["status"] == ENDED and row["ledger_entries"] is not None
        if row["status"] == ENDED and row["end_reason"] != ABANDONED and not recorded:
            problems.append("the episode ended without its ledger recorded")
        if recorded:
            if len(entries) != row["ledger_entries"]:
                problems.append(f"the ledger has {len(entries)} entries; {row['ledger_entries']} when the episode ended")
            if not chain_intact(entries):
                problems.append("the ledger's hash chain is broken")
            elif last_hash(entries) != row["ledger_digest"]:
                problems.append("the ledger does not end on the hash recorded when the episode ended")
            intact = intact and not problems
        mart = None
        if recorded:
            try:
                sql = suites.get(case.suite).mart_sql if case is not None else MART_SQL
                mart = read_mart(self.warehouse_image(episode_id), row["warehouse"], row["warehouse_sha256"], sql)
            except StoreError as exc:
                problems.append(str(exc))
        if row.get("transcript_sha256") is not None:
            log = self._transcript_text(episode_id)
            if log is None:
                problems.append("the episode's transcript is missing from the run store")
            elif sha256(log) != row["transcript_sha256"]:
                problems.append("the episode's transcript was altered (its SHA-256 differs from the one recorded)")
        return StoredEpisode(
            episode_id=episode_id, case=case, agent=row["agent"],
            options=options if isinstance(options, dict) else {}, run_id=row["run_id"], rollout=row["rollout"],
            status=row["status"], end_reason=_as_text(row["end_reason"]), error=_as_text(row["error"]), entries=entries,
            ledger_digest=row["ledger_digest"] or "", mart=mart, problems=tuple(problems),
            case_json=case_json if isinstance(case_json, str) else "", case_id=row["case_id"], intact=intact)

    # -- grades -------------------------------------------------------------------------------
    def ungraded(self) -> list[str]:
        """Ended episodes with no grade yet, oldest first."""
        graded = select(grades.c.episode_id)
        return [r["episode_id"] for r in self._rows(select(episodes.c.episode_id)
                                                     .where(episodes.c.status == ENDED, episodes.c.episode_id.not_in(graded))
                                                     .order_by(episodes.c.ended_at))]

    def add_grade(self, episode_id: str, agent: str, grade: Grade, run_id: str = "") -> bool:
        """Keep an episode's grade once; False if it already had one (nothing is changed)."""
        record = {**grade.as_dict(), "agent": agent, "episode_id": episode_id, "run_id": run_id}
        try:
            with self.engine.begin() as c:
                c.execute(insert(grades).values(episode_id=episode_id, case_id=grade.case_id, agent=agent,
                                                grade=json.dumps(record, sort_keys=True), graded_at=time.time()))
        except IntegrityError:
            return False
        return True

    def grades_after(self, grade_seq: int, limit: int | None = None) -> list[tuple[int, dict]]:
        """Kept grades after a sequence number, the first `limit` of them when given (a row that does not parse
        comes back as a stub saying so)."""
        rows = self._rows(select(grades.c.grade_seq, grades.c.episode_id, grades.c.case_id, grades.c.agent,
                                 grades.c.grade).where(grades.c.grade_seq > grade_seq)
                          .order_by(grades.c.grade_seq).limit(limit))
        return [(r["grade_seq"], _grade_json(r["grade"], r["episode_id"], r["case_id"], r["agent"])) for r in rows]

    def recorded_grade(self, episode_id: str) -> dict | None:
        rows = self._rows(select(grades.c.grade, grades.c.case_id, grades.c.agent).where(grades.c.episode_id == episode_id))
        return None if not rows else _grade_json(rows[0]["grade"], episode_id, rows[0]["case_id"], rows[0]["agent"])

    def latest_grades(self, case_id: str) -> dict[str, dict]:
        """{agent: its latest kept grade} for one case."""
        with self.engine.connect() as c:
            rows = c.execute(select(grades.c.agent, grades.c.episode_id, grades.c.grade)
                             .where(grades.c.case_id == case_id).order_by(grades.c.grade_seq)).all()
        return {agent: _grade_json(g, eid, case_id, agent) for agent, eid, g in rows}

    def grade_count(self, episode_id: str) -> int:
        with self.engine.connect() as c:
            return len(c.execute(select(grades.c.grade_seq).where(grades.c.episode_id == episode_id)).all())

    # -- text kept with its seal: a nightly summary, a step output -------------------------------
    def _text_seal(self, head: list, text: str) -> str:
        """The HMAC under the store's key of what a text is (`head`: its kind and where it belongs) and the text."""
        what = json.dumps(head, ensure_ascii=True)
        return hmac.new(self.key, f"{what}\n{text}".encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def _sealed_text(self, head: list, text: str) -> str:
        """`text` as it is kept: its seal (`_text_seal`), a newline, the text."""
        return f"{self._text_seal(head, text)}\n{text}"

    def _unsealed_text(self, head: list, kept) -> tuple[str | None, bool]:
        """(the text, whether its seal holds for `head`) of a value `_sealed_text` kept; None for a value that is not
        text, and text with no seal line (kept by an older gate) as itself, unsealed."""
        if not isinstance(kept, str):
            return None, False
        seal, newline, text = kept.partition("\n")
        if not newline:
            return kept, False
        return text, hmac.compare_digest(seal.encode("ascii", "replace"), self._text_seal(head, text).encode("ascii"))

    # -- nightly history ----------------------------------------------------------------------
    @staticmethod
    def _summary_head(run_id) -> list:
        return ["nightly summary", run_id if isinstance(run_id, str) else ""]

    def add_nightly(self, summary: dict, run_id: str | None = None) -> int:
        """Keep a night's summary, sealed under the store's key with its run (the text: the seal, a newline, the JSON)."""
        with self.engine.begin() as c:
            return self._add_nightly(c, summary, run_id)

    def _add_nightly(self, c, summary: dict, run_id: str | None) -> int:
        text = json.dumps(summary, sort_keys=True)
        result = c.execute(insert(nightly).values(run_id=run_id, at=time.time(),
                                                  summary=self._sealed_text(self._summary_head(run_id), text)))
        return int(result.inserted_primary_key[0])

    def _kept_summary(self, row: Mapping) -> tuple[object, bool]:
        """(a kept summary parsed, or None when it does not parse; whether its seal holds). A summary kept by an older
        gate is its JSON alone, unsealed."""
        text, sealed = self._unsealed_text(self._summary_head(row["run_id"]), row["summary"])
        return _json_or_none(text), sealed

    def nightly_history(self, limit: int = 30) -> list[dict]:
        """The last `limit` nightly summaries that are readable, oldest first: {night, run_id, at, summary}: what the
        scoreboard's history shows and the regression line compares with. A kept summary is a cache: one that does
        not parse, is not the shape the scoreboard writes, or whose seal does not hold (edited, or kept by an older
        gate) is skipped (`gate verify` recomputes each), never an error, never believed."""
        kept: list[dict] = []
        if limit < 1:
            return kept
        page = min(max(limit, NIGHTS_PAGE), 10 * NIGHTS_PAGE)
        query = select(nightly).order_by(nightly.c.night_seq.desc()).limit(page)
        rows = self._rows(query)  # newest first, a page at a time: a store of years of nights is not read whole
        while rows:
            for r in rows:
                summary, sealed = self._kept_summary(r)
                if sealed and summary_problem(summary) is None:
                    kept.append({"night": r["night_seq"], "run_id": r["run_id"], "at": r["at"], "summary": summary})
                    if len(kept) >= limit:
                        return kept[::-1]
            if len(rows) < page:
                break
            rows = self._rows(query.where(nightly.c.night_seq < rows[-1]["night_seq"]))
        return kept[::-1]


    def nights(self) -> list[dict]:
        """Every nightly summary as kept (a cache `gate verify` recomputes): {night, run_id, at, summary, sealed}; a
        summary that does not parse comes back as None."""
        rows = self._rows(select(nightly).order_by(nightly.c.night_seq))
        return [{"night": r["night_seq"], "run_id": r["run_id"], "at": r["at"], "summary": kept, "sealed": sealed}
                for r in rows for kept, sealed in [self._kept_summary(r)]]

    def all_grades(self) -> list[dict]:
        """Every kept grade row (a cache `gate verify` recomputes): {grade_seq, episode_id, case_id, agent, grade}."""
        rows = self._rows(select(grades).order_by(grades.c.grade_seq))
        return [{"grade_seq": r["grade_seq"], "episode_id": r["episode_id"], "case_id": r["case_id"],
                 "agent": r["agent"], "grade": _grade_json(r["grade"], r["episode_id"], r["case_id"], r["agent"])}
                for r in rows]

    # -- sealed runs: what a night or a `gate run` must produce, recorded when it starts ------
    def _manifest_seal(self, row: dict) -> str:
        return self._hmac([row.get(k) for k in MANIFEST_SEALED])

    @staticmethod
    def _holds(row: Mapping, seal_of) -> bool:
        """Whether a stored row's seal is the one `seal_of` (the store's `seal` or `_manifest_seal`) makes of it. gate
        seals a row again only when it holds: a row edited without the key is never vouched for by a writer with it."""
        try:
            return isinstance(row["seal"], str) and bool(row["seal"]) and hmac.compare_digest(row["seal"], seal_of(dict(row)))
        except (TypeError, ValueError):
            return False

    def seal_run(self, run_id: str, kind: str, body: dict) -> dict:
        """Record, when a run starts, what it must produce (`body`: its cases, agents, rollouts, the case
        file's hash, the gate version); a run sealed before keeps its manifest. The manifest, as stored."""
        row = {"run_id": run_id, "kind": kind, "body": json.dumps(body, sort_keys=True), "status": OPEN,
               "episodes": None, "created_at": time.time(), "closed_at": None}
        try:
            with self.engine.begin() as c:
                c.execute(insert(manifests).values(**row, seal=self._manifest_seal(row)))
        except IntegrityError:
            if kind not in (API, CONTINUATION):  # a run whose episodes were stored before it was sealed (through
                with self.engine.begin() as c:  # the API, `seal_api_run`): its manifest is now the real one
                    c.execute(update(manifests).where(manifests.c.run_id == run_id, manifests.c.kind == API,
                                                      manifests.c.status == OPEN)  # a completed one stands
                              .values(**row, seal=self._manifest_seal(row)))
        return self.manifest(run_id)  # type: ignore[return-value]

    def manifest(self, run_id: str) -> dict | None:
        """A run's manifest: {run_id, kind, body, status, episodes, created_at, closed_at, sealed}; `sealed`
        says whether its seal holds (None if the run has none)."""
        rows = self._rows(select(manifests).where(manifests.c.run_id == run_id))
        return None if not rows else self._manifest_of(rows[0])

    def manifests(self, status: str | None = None) -> list[dict]:
        """Every manifest, oldest first (only those in `status` when given)."""
        query = select(manifests).order_by(manifests.c.created_at)
        if status is not None:
            query = query.where(manifests.c.status == status)
        return [self._manifest_of(r) for r in self._rows(query)]

    def _manifest_of(self, row: dict) -> dict:
        """A manifest row as read: its body and episodes parsed and their shape checked once, here (a row
        can be hostile, sealed or not). `problem` says what is wrong with one that is not readable; its
        body and episodes are then None."""
        sealed = self._holds(row, self._manifest_seal)
        body, chosen = _json_or_none(row["body"]), _json_or_none(row["episodes"])
        problem = manifest_problem(row["kind"], body, row["status"], chosen)
        if problem is not None:
            body = chosen = None
        return {**row, "body": body, "episodes": chosen, "sealed": sealed, "problem": problem}

    def _set_run(self, run_id: str, values: dict, unless: tuple[str, ...], c=None) -> bool:
        """Seal run `run_id`'s manifest again with `values`, unless its status is one of `unless` or its seal does not
        hold; in the transaction of connection `c` when given, else in one of its own."""
        if c is None:
            with self.engine.begin() as c:
                return self._set_run(run_id, values, unless, c)
        row = c.execute(select(manifests).where(manifests.c.run_id == run_id)).mappings().first()
        if row is None or row["status"] in unless or not self._holds(row, self._manifest_seal):
            return False  # (a manifest whose seal fails is left as it is found, for `gate verify` to name)
        new = {**dict(row), **values}
        done = c.execute(update(manifests).where(manifests.c.run_id == run_id, manifests.c.status == row["status"])
                         .values(**values, seal=self._manifest_seal(new)))
        return done.rowcount == 1

    @staticmethod
    def _completed(chosen: list[tuple[str, str, int, str]]) -> dict:
        return {"status": COMPLETE, "episodes": json.dumps([list(x) for x in chosen]), "closed_at": time.time()}

    def complete_run(self, run_id: str, chosen: list[tuple[str, str, int, str]]) -> bool:
        """Seal a run as complete with the episodes that count, one per (case, agent, rollout)."""
        return self._set_run(run_id, self._completed(chosen), unless=(COMPLETE,))

    def complete_night(self, night: str, chosen: list[tuple[str, str, int, str]], summary: dict, kept_by: str) -> int:
        """A night's end, in one transaction: its summary kept (by run `kept_by`: the night, or its re-execution) and
        its manifest sealed as complete (`complete_run`), or neither: a process killed in between, or a manifest that
        cannot be completed (StoreError), leaves no summary (one kept for a night left open once read as a night whose
        episodes were missing). The summary's number."""
        with self.engine.begin() as c:
            number = self._add_nightly(c, summary, kept_by)
            if not self._set_run(night, self._completed(chosen), unless=(COMPLETE,), c=c):
                raise StoreError(f"night {night}: its manifest is missing, complete already, or altered (its seal does "
                                 "not match): the night is not completed, and its summary not kept")
        return number

    def close_run(self, run_id: str, status: str) -> bool:
        """Seal an open run as ended without completing (STOPPED: its process stopped it; DIED: it died)."""
        return self._set_run(run_id, {"status": status, "closed_at": time.time()}, unless=(COMPLETE, STOPPED, DIED))

    def seal_api_run(self, run_id: str) -> None:
        """Record that run `run_id` exists, when nothing sealed it as a night or a run before its first episode
        (an episode stored through the Python API, `StoreSink`): its manifest lists no episodes until its caller
        completes it (`complete_api_run`), but an episode of it whose manifest is gone is then a deletion."""
        if self.manifest(run_id) is None:
            from . import __version__
            self.seal_run(run_id, API, {"gate_version": __version__, "process": process_name("the Python API")})

    def complete_api_run(self, run_id: str, episode_ids: Iterable[str]) -> int:
        """Seal run `run_id`, whose episodes were stored through the Python API, as complete (`StoreSink.complete`
        calls it): its manifest then lists its episodes, and `gate verify` names one deleted from the run or stored
        in it after. `episode_ids` are the episodes the caller stored in it, by its own record (the store is what
        an attacker may write: an episode deleted before now would not be listed): each must be in the store, and
        every episode of the run must have ended. Checked, listed and sealed in one transaction. The number of
        episodes listed; StoreError when `run_id` is no open API run, or an episode is missing or still running."""
        wanted = set(episode_ids)
        with self.engine.begin() as c:
            row = c.execute(select(manifests).where(manifests.c.run_id == run_id)).mappings().first()
            if row is None or row["kind"] != API or row["status"] != OPEN:
                raise StoreError(f"run {run_id!r} is not an open run of episodes stored through the Python API")
            if not self._holds(row, self._manifest_seal):
                raise StoreError(f"run {run_id!r}: its manifest was altered (its seal does not match); it is not completed")
            held = c.execute(select(episodes.c.episode_id, episodes.c.case_id, episodes.c.agent, episodes.c.rollout,
                                    episodes.c.status).where(episodes.c.run_id == run_id)
                             .order_by(episodes.c.started_at)).all()
            missing = sorted(wanted - {r.episode_id for r in held})
            if missing:
                raise StoreError(f"run {run_id!r}: episode {missing[0]} is not in the store ({len(missing)} of the "
                                 f"{len(wanted)} stored in it are not): it is not completed")
            running = [r.episode_id for r in held if r.status != ENDED]
            if running:
                raise StoreError(f"run {run_id!r}: episode {running[0]} has not ended; complete the run once every "
                                 f"episode of it has")
            chosen = json.dumps([[r.case_id, r.agent, r.rollout, r.episode_id] for r in held])
            values = {"status": COMPLETE, "episodes": chosen, "closed_at": time.time()}
            done = c.execute(update(manifests).where(manifests.c.run_id == run_id, manifests.c.kind == API,
                                                     manifests.c.status == OPEN)
                             .values(**values, seal=self._manifest_seal({**dict(row), **values})))
            if done.rowcount != 1:
                raise StoreError(f"run {run_id!r} changed while it was being completed; try again")
        return len(held)

    def continue_run(self, run_id: str, of: str) -> None:
        """Record that run `run_id` re-executes run `of` (a Dagster re-execution): its episodes count for `of`."""
        if run_id != of:
            self.seal_run(run_id, CONTINUATION, {"of": of})

    def run_lock(self, run_id: str) -> Path:
        """The lock a process holds on this machine while it plays run `run_id` (`hold_lock`)."""
        return self.home / LOCKS / f"{_UNSAFE.sub('_', _as_text(run_id))}.lock"  # (an id edited into a BLOB: its repr)

    def close_dead_runs(self) -> list[tuple[str, list[str]]]:
        """Close every open run whose process, on this machine, died (its lock under GATE_HOME is free):
        its open episodes end as abandoned (graded 0 with that reason) and the run is sealed as DIED.
        [(run id, the episodes closed)]."""
        closed = []
        for m in self.manifests(status=OPEN):
            lock = self.run_lock(m["run_id"])
            if not lock_free(lock):
                continue
            holder = (m["body"] or {}).get("process", "its process") if isinstance(m["body"], dict) else "its process"
            reason = f"{holder} died before the episode ended"
            eids = [ep["episode_id"] for ep in self.episodes(run_id=m["run_id"], status=RUNNING)
                    if self.close_abandoned(ep["episode_id"], reason)]
            if self.close_run(m["run_id"], DIED):
                closed.append((m["run_id"], eids))
            try:
                lock.unlink()
            except OSError:
                pass
        return closed

    # -- Dagster step outputs (the nightly job's IO manager) ----------------------------------
    def put_output(self, run_id: str, step_key: str, output: str, value: str) -> None:
        """Keep one step output (JSON text), sealed under the store's key with the run, step and output it is;
        a step that runs again replaces what it wrote."""
        key = (step_outputs.c.run_id == run_id) & (step_outputs.c.step_key == step_key) & (step_outputs.c.output == output)
        sealed = self._sealed_text(["step output", run_id, step_key, output], value)
        with self.engine.begin() as c:
            c.execute(step_outputs.delete().where(key))
            c.execute(insert(step_outputs).values(run_id=run_id, step_key=step_key, output=output, value=sealed))

    def get_output(self, run_id: str, step_key: str, output: str) -> str | None:
        """A step output as `put_output` kept it (None if there is none). A step output is stored data that the next
        step acts on (the agents it imports, the grades the scoreboard shows): one whose seal does not hold (edited,
        moved from another run or step, or kept by another key) is a StoreError, never read."""
        rows = self._rows(select(step_outputs.c.value).where(
            step_outputs.c.run_id == run_id, step_outputs.c.step_key == step_key, step_outputs.c.output == output))
        text = rows[0]["value"] if rows else None
        if text is None:
            return None
        value, sealed = self._unsealed_text(["step output", run_id, step_key, output], text)
        if not value or not sealed:
            raise StoreError(f"step output {output!r} of step {step_key!r} in run {run_id}: its seal does not match "
                             "(it was altered, or kept by another key or an older gate); it is not read: run the night again")
        return value


def _first_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _json_or_none(text):
    try:
        return json.loads(text) if text is not None else None
    except (ValueError, RecursionError, TypeError):
        return None


def manifest_body(cases: list[Case], cases_file: str | Path | None, agents: list, rollouts: int,
                  process: str) -> dict:
    """What a run must produce, as `seal_run` records it: its cases (ids, in order, with the SHA-256 of
    each as stored with its episodes), the case file and its SHA-256, the agents (`AgentSpec`s: name,
    identity, options, deterministic), the rollouts per case, the gate version and the process playing it."""
    from . import __version__
    file_sha = None
    if cases_file is not None:
        try:
            file_sha = sha256(read_bytes(cases_file, "case file", None, StoreError))
        except StoreError:
            file_sha = None
    return {"cases_file": None if cases_file is None else str(Path(cases_file).absolute()), "cases_file_sha256": file_sha,
            "cases": [c.case_id for c in cases],
            "case_sha256": {c.case_id: sha256(json.dumps(c.data, sort_keys=True)) for c in cases},
            "agents": [{"name": a.name, "identity": a.identity, "deterministic": a.deterministic,
                        "options": json.loads(json.dumps(a.options, sort_keys=True, default=repr))} for a in agents],
            "rollouts": rollouts, "gate_version": __version__, "process": process}


def _text(x) -> bool:
    return isinstance(x, str)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def manifest_problem(kind, body, status, chosen) -> str | None:
    """What makes a stored manifest (its kind, parsed body, status and chosen episodes) other than the shape
    `manifest_body`, `continue_run`, `seal_api_run` and `complete_run` write, or None."""
    if status not in (OPEN, COMPLETE, STOPPED, DIED):
        return "its status is not one gate writes"
    if not isinstance(body, dict):
        return "its body is not a JSON object"
    if kind == CONTINUATION:
        return None if _text(body.get("of")) and body["of"] else "it continues no run (its `of` is not a run id)"
    if kind == API:  # its episodes are listed when its caller completes it (`complete_api_run`), not before
        if (status == COMPLETE) != (chosen is not None):
            return "an API run lists its episodes when, and only when, it is complete"
        return _chosen_problem(chosen)
    cases, agents, rollouts = body.get("cases"), body.get("agents"), body.get("rollouts")
    if not (isinstance(cases, list) and all(_text(c) for c in cases)):
        return "its cases are not a list of case ids"
    if not (isinstance(agents, list) and all(
            isinstance(a, dict) and _text(a.get("identity")) and _text(a.get("name"))
            and isinstance(a.get("options"), dict) and isinstance(a.get("deterministic"), bool) for a in agents)):
        return "its agents are not a list of {identity, name, options, deterministic}"
    if len({a["identity"] for a in agents}) != len(agents):
        return "it lists an agent twice"
    if not (_count(rollouts) and 1 <= rollouts and len(cases) * len(agents) * rollouts <= MAX_SLOTS):
        return f"its rollouts are not a count of 1 or more (of at most {MAX_SLOTS:,} episodes in all)"
    shas = body.get("case_sha256")
    if not (isinstance(shas, dict) and all(_text(v) for v in shas.values())):
        return "its case hashes are not a JSON object of texts"
    for key in ("cases_file", "cases_file_sha256", "process"):
        if body.get(key) is not None and not _text(body[key]):
            return f"its {key} is not text"
    return _chosen_problem(chosen)


def _chosen_problem(chosen) -> str | None:
    """What makes a manifest's episodes (None: not listed) other than [case id, agent, rollout, episode id]s."""
    if chosen is not None and not (isinstance(chosen, list) and all(
            isinstance(i, list) and len(i) == 4 and _text(i[0]) and _text(i[1]) and _count(i[2]) and _text(i[3])
            for i in chosen)):
        return "its episodes are not a list of [case id, agent, rollout, episode id]"
    return None


def summary_problem(summary) -> str | None:
    """What makes a kept nightly summary other than the shape the scoreboard writes, or None."""
    if not isinstance(summary, dict) or not isinstance(summary.get("agents"), dict):
        return "it is not a JSON object with agents"
    for figures in summary["agents"].values():
        reward = figures.get("reward") if isinstance(figures, dict) else None
        if not (isinstance(reward, (int, float)) and not isinstance(reward, bool) and reward == reward):
            return "an agent of it has no reward"
    if summary.get("cases_file") is not None and not _text(summary["cases_file"]):
        return "its cases_file is not text"
    return None


def _beside(key_file: Path, database: Path) -> bool:
    """Whether the key file is in the database's folder, by either path as given or where it leads: a key
    there that is a link to a file elsewhere is still replaced by whoever can write the folder."""
    folders = {Path(os.path.abspath(database)).parent, database.resolve().parent}
    keys = (Path(os.path.abspath(key_file)), key_file.resolve())
    return any(folder in key.parents for folder in folders for key in keys)


def process_name(what: str) -> str:
    """How a manifest names the process playing its run: what, which process, on which machine."""
    return f"{what} (process {os.getpid()} on {socket.gethostname()})"


UNREADABLE_JSON = "the kept grade is not readable JSON"  # the store's reason, where a grade row is not JSON


def _grade_json(text: str, episode_id: str, case_id: str, agent: str) -> dict:
    try:
        grade = json.loads(text)
        if isinstance(grade, dict):
            return grade
    except (ValueError, RecursionError, TypeError):
        pass
    return {"episode_id": episode_id, "case_id": case_id, "agent": agent, "unreadable": True,
            "reason": UNREADABLE_JSON}


class StoreSink(Sink):
    """The engine sink that keeps every episode it sees in a run store: its row when it opens (so an
    episode whose process dies is known, and graded 0), then everything else when it ends.

    `batch` keeps that many ended episodes before writing them in one transaction (`flush` writes
    what is kept); episodes that ended before one opens are written with its row, in its
    transaction, so whenever an episode is playing every episode that ended before it is stored
    (the nightly keeps a chunk's episodes this way: one transaction per episode, not two).
    `announce=False` writes nothing until the episode ends: for callers that play a cut-off or
    unwritten episode again rather than grade it (`gate run` on resume). `every`, when given, also
    writes what is kept once that many seconds have passed since the last write (so a process
    killed with -9 loses at most that much work, however slow its episodes). `before_commit`, when
    given, is called with the episodes about to be written, before the transaction (`gate run`
    writes their transcript lines there, so every stored episode has one). An episode the machine failed is
    closed as cut off (`fail`). `complete(run_id)` ends a run played through the Python API: its manifest then
    lists its episodes (`RunStore.complete_api_run`)."""
    wants_warehouse = True

    def __init__(self, store: RunStore, announce: bool = True, batch: int = 1,
                 before_commit: Callable[[list[EpisodeResult]], None] | None = None, every: float | None = None):
        self.store = store
        self.announce = announce
        self.batch = batch
        self.before_commit = before_commit
        self.every = every
        self.written = time.monotonic()
        self.starts: dict[str, EpisodeStart] = {}
        self.announced: dict[str, dict] = {}  # the rows written as episodes opened, until they end
        self.ended: list[tuple[EpisodeResult, EpisodeStart | None]] = []
        self.runs: set[str] = set()  # the runs this sink knows to have a manifest
        self.stored: dict[str, list[str]] = {}  # run id -> the episodes this sink stored in it (`complete`)

    def start(self, episode: EpisodeStart) -> None:
        if episode.run_id not in self.runs:  # once per run: a night's or a `gate run`'s was sealed before
            self.store.seal_api_run(episode.run_id)
            self.runs.add(episode.run_id)
        if not self.announce:
            self.starts[episode.episode_id] = episode
        elif self.ended:
            self.announced[episode.episode_id] = self._write(opening=episode)
        else:
            self.announced[episode.episode_id] = self.store.start_episode(episode)

    def end(self, result: EpisodeResult) -> None:
        self.ended.append((result, self.starts.pop(result.episode_id, None)))
        if len(self.ended) >= self.batch or (self.every is not None and time.monotonic() - self.written >= self.every):
            self.flush()

    def flush(self) -> None:
        if self.ended:
            self._write()

    def fail(self, episode_id: str, reason: str) -> None:
        """An episode the machine failed (no room for its database) ends in the store as one cut off does: graded 0
        with the reason, so its run can end and be completed. One written only when it ends (`announce=False`)
        leaves nothing, and is played again on resume."""
        self.starts.pop(episode_id, None)
        row = self.announced.get(episode_id)
        if row is None:
            return
        self.flush()  # the episodes that ended before it first, as they ended
        del self.announced[episode_id]
        if self.store.close_abandoned(episode_id, reason):
            self.stored.setdefault(row["run_id"], []).append(episode_id)

    def complete(self, run_id: str = "") -> int:
        """Write what is kept, then seal run `run_id` (episodes stored through the Python API, this sink's or
        others') as complete with its episodes, every one this sink stored in it among them
        (`RunStore.complete_api_run`): from then on `gate verify` names an episode deleted from it. Call it once
        the run's last episode has ended. The number of episodes the run lists."""
        self.flush()
        return self.store.complete_api_run(run_id, self.stored.get(run_id, ()))

    def _write(self, opening: EpisodeStart | None = None):
        self.written = time.monotonic()
        ended, self.ended = self.ended, []
        if self.before_commit is not None and ended:
            self.before_commit([result for result, _ in ended])
        row = self.store.end_episodes(ended, opening, self.announced)
        for result, _ in ended:
            self.announced.pop(result.episode_id, None)
            self.stored.setdefault(result.run_id, []).append(result.episode_id)
        return row
