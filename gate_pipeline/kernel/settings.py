"""The one settings object: where gate keeps runs and where it reads cases and contracts.

| variable         | what                                          | default                                   |
|------------------|-----------------------------------------------|-------------------------------------------|
| `GATE_HOME`      | run store, episode warehouses, Dagster home   | `.gate/` in the working directory         |
| `GATE_DB_URL`    | the run store's database (SQLAlchemy URL)     | `sqlite:///$GATE_HOME/runs.db`            |
| `GATE_CASES_DIR` | case files (`<suite>/<split>.jsonl`)          | the cases shipped with gate               |
| `GATE_CONTRACTS` | contract documents and `variants/`            | the contracts shipped with gate           |
| `GATE_STORE_KEY` | the key sealing stored episodes (HMAC)        | a random key in `$GATE_HOME/store.key`    |
| `GATE_STORE_KEY_FILE` | a file holding that key (kept away from the database) | as above                 |
| `GATE_AGENTS`    | more agent names Dagster runs may use         | none (built-ins, plugins, variants)       |
| `GATE_SUITES`    | more suites, `module:attribute`, comma-separated | none (gate's suites and installed plugins) |
| `GATE_NIGHTLY_SCHEDULE` | `off`: the 02:00 schedule starts stopped | on                                     |
| `GATE_CELERY_BROKER` | the broker of `nightly_benchmark_celery` (and its result backend) | `redis://127.0.0.1:6379/0` |
| `GATE_SERVE_TOKEN` | the bearer token `gate serve` requires (`--token` overrides it) | none: loopback only |

Environment variables are read here only, by `Settings.from_env()`, once per process entry point
(a command, the Dagster definitions' load, a server's start, an environment factory), and the
settings are passed down from there; the kernel takes explicit paths. The
shipped cases and contracts are package data (`gate_pipeline/data/`); in a clone of the
repository those are links to its `cases/` and `contracts/`, the files you edit.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .contract import SHIPPED_CONTRACTS
from .errors import GateError
from .files import path_state
from .suite import suites

SHIPPED_CASES = Path(__file__).resolve().parents[1] / "data" / "cases"
SPLIT_FILES = {"eval": "eval_curated.jsonl", "train": "train_procedural.jsonl"}
VARIABLES = ("GATE_HOME", "GATE_DB_URL", "GATE_CASES_DIR", "GATE_CONTRACTS", "GATE_STORE_KEY", "GATE_STORE_KEY_FILE",
             "GATE_AGENTS", "GATE_SUITES", "GATE_NIGHTLY_SCHEDULE", "GATE_CELERY_BROKER", "GATE_SERVE_TOKEN")
DEFAULT_CELERY_BROKER = "redis://127.0.0.1:6379/0"


def resolved_path(path: Path) -> Path:
    """`path` made absolute, its links followed where they can be: a link that loops is left as it is (what
    reads or writes it then says so in one line), not a RuntimeError."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return path.absolute()


def expanded_path(value: str, label: str, error: type[Exception] = GateError) -> Path:
    """A path as it is given, `~` expanded; `error` naming `label` where `~someone` names no user here."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        raise error(f"{label}: cannot expand {value.split('/', 1)[0]} (no such user)") from None


def given_path(value: str) -> Path:
    """`expanded_path`, but the name kept as it is where `~someone` names no user (what opens it then says
    what is wrong)."""
    try:
        return expanded_path(value, value)
    except GateError:
        return Path(value)


@dataclass(frozen=True)
class Settings:
    home: Path
    db_url: str | None = None
    cases_dir: Path = SHIPPED_CASES
    contracts_dir: Path = SHIPPED_CONTRACTS
    store_key: str | None = None
    store_key_file: Path | None = None
    extra_agents: tuple[str, ...] = ()
    extra_suites: tuple[str, ...] = ()
    nightly_schedule: bool = True
    celery_broker: str = DEFAULT_CELERY_BROKER
    serve_token: str | None = field(default=None, repr=False)  # a secret: never printed

    @classmethod
    def from_env(cls, environ=None) -> Settings:
        env = os.environ if environ is None else environ

        def path(name: str, default):
            value = (env.get(name) or "").strip()
            if not value:
                return default
            return resolved_path(expanded_path(value, f"{name}={value}"))

        return cls(home=path("GATE_HOME", Path(".gate").resolve()),
                   db_url=(env.get("GATE_DB_URL") or "").strip() or None,
                   cases_dir=path("GATE_CASES_DIR", SHIPPED_CASES),
                   contracts_dir=path("GATE_CONTRACTS", SHIPPED_CONTRACTS),
                   store_key=env.get("GATE_STORE_KEY") or None,
                   store_key_file=path("GATE_STORE_KEY_FILE", None),  # type: ignore[arg-type]
                   extra_agents=tuple(a.strip() for a in (env.get("GATE_AGENTS") or "").split(",") if a.strip()),
                   extra_suites=tuple(a.strip() for a in (env.get("GATE_SUITES") or "").split(",") if a.strip()),
                   nightly_schedule=(env.get("GATE_NIGHTLY_SCHEDULE") or "on").strip().lower() != "off",
                   celery_broker=(env.get("GATE_CELERY_BROKER") or "").strip() or DEFAULT_CELERY_BROKER,
                   serve_token=env.get("GATE_SERVE_TOKEN") or None)

    @property
    def store_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'runs.db'}"

    def cases_file(self, split: str = "eval", suite: str | None = None) -> Path:
        """A suite's case file under the cases directory (`<suite>/eval_curated.jsonl`...; the default
        suite's when none is named)."""
        return self.cases_dir / (suite or suites.default().name) / SPLIT_FILES.get(split, f"{split}.jsonl")

    def register_suites(self) -> None:
        """Register the suites GATE_SUITES names (once per process entry point)."""
        if self.extra_suites:
            suites.add_modules(self.extra_suites)

    def problems(self, environ=None) -> list[str]:
        """What is wrong with the directories the environment names: where gate looked, from where."""
        env = os.environ if environ is None else environ
        out = []
        for name, path in (("GATE_CASES_DIR", self.cases_dir), ("GATE_CONTRACTS", self.contracts_dir)):
            raw = (env.get(name) or "").strip()
            if raw and path_state(path) != "directory":
                out.append(f"{name}={raw}: no such directory (looked for {path}"
                           + (f", from {Path.cwd()})" if not given_path(raw).is_absolute() else ")"))
        if path_state(self.home) not in ("missing", "directory"):
            out.append(f"GATE_HOME: {self.home} is a file, not a directory")
        return out

    def describe(self) -> dict[str, str]:
        """Each setting as resolved, for messages that say where gate looked."""
        return {"GATE_HOME": str(self.home), "GATE_DB_URL": self.store_url,
                "GATE_CASES_DIR": str(self.cases_dir), "GATE_CONTRACTS": str(self.contracts_dir)}
