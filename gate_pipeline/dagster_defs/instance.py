"""The Dagster instance `gate ui` runs on: run monitoring on, telemetry off; its storage (runs,
events, schedules) in SQLite files in DAGSTER_HOME, or, when GATE_DB_URL names a PostgreSQL
database, in that database, through dagster-postgres (the `postgres` extra): then every machine
whose dagster.yaml points there sees the same runs, and the file is readable by its owner only,
since it holds the URL (password included).

`gate ui` writes `dagster.yaml` when the directory has none, or when the one there is gate's
own (its first line is MARKER); a `dagster.yaml` someone wrote by hand is left as it is, and
`gate ui` says which of gate's settings it lacks.

Run monitoring (Dagster's daemon): a run that has not started within START_TIMEOUT_S fails; a
run still going past its `dagster/max_runtime` tag (every gate job sets one, see jobs.py) fails,
which is how a run whose worker died with the machine ends: Dagster's default run launcher
cannot ask a worker's health. Both are checked every POLL_INTERVAL_S. When such a run fails,
`failed_run_sensor` closes its open episodes and the grading sensor grades them 0 with the reason.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = "# written by gate ui: delete this line to keep your own edits"
POLL_INTERVAL_S = 15
START_TIMEOUT_S = 180
CANCEL_TIMEOUT_S = 180

SQLITE_STORAGE = "# SQLite run, event and schedule storage in this directory (Dagster's default).\n"
INSTANCE_YAML = f"""{MARKER}
{{storage}}telemetry:
  enabled: false
run_monitoring:
  enabled: true
  poll_interval_seconds: {POLL_INTERVAL_S}
  start_timeout_seconds: {START_TIMEOUT_S}
  cancel_timeout_seconds: {CANCEL_TIMEOUT_S}
"""

REQUIRED = {"run_monitoring": "runs whose worker died stay STARTED",
            "telemetry": "Dagster's telemetry is on"}


def postgres_url(db_url: str | None) -> str | None:
    """dagster-postgres's URL for a PostgreSQL GATE_DB_URL, else None. It names psycopg2, the driver
    dagster-postgres is written for (SQLAlchemy 2.1 takes psycopg 3 for a bare `postgresql://`)."""
    if not db_url:
        return None
    from sqlalchemy.engine import make_url
    try:
        url = make_url(db_url)
    except Exception:  # noqa: BLE001 - not a URL: the run store says what is wrong with it
        return None
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


def instance_yaml(db_url: str | None = None) -> str:
    """gate's dagster.yaml: Dagster's storage in PostgreSQL when `db_url` is a PostgreSQL URL."""
    pg = postgres_url(db_url)
    if pg is None:
        return INSTANCE_YAML.replace("{storage}", SQLITE_STORAGE)
    storage = ("# runs, events and schedules in the run store's PostgreSQL database (GATE_DB_URL), through\n"
               "# dagster-postgres\n"
               f"storage:\n  postgres:\n    postgres_url: {json.dumps(pg)}\n")
    return INSTANCE_YAML.replace("{storage}", storage)


def prepare_instance_dir(home: Path, db_url: str | None = None) -> list[str]:
    """Write gate's dagster.yaml into `home` unless someone else's is there; return warnings."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    try:
        existing = path.read_text(encoding="utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        return [f"cannot read {path} ({exc}); Dagster will report what is wrong with it"]
    if existing is None or existing.startswith(MARKER):
        wanted = instance_yaml(db_url)
        if existing != wanted:
            tmp = path.with_name(f".dagster.yaml.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold a password
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(wanted)
            os.replace(tmp, path)
        return []
    return [f"{path} is not gate's, so it is kept as it is; it has no `{key}` section: {why}"
            for key, why in REQUIRED.items() if not _has_section(existing, key)]


def _has_section(text: str, key: str) -> bool:
    return any(line.split("#", 1)[0].rstrip() == f"{key}:" or line.startswith(f"{key}: ")
               for line in text.splitlines())


LOCATION = "gate"
WORKSPACE_YAML = f"""# written by gate ui (rewritten at every start): gate's code location from the installed package
load_from:
  - python_module:
      module_name: gate_pipeline.dagster_defs.definitions
      attribute: defs
      location_name: {LOCATION}
"""


def write_workspace(home: Path) -> Path:
    """The workspace file `gate ui` serves: the code location named `gate`, as in the repository's workspace.yaml."""
    path = home / "gate-workspace.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != WORKSPACE_YAML:
        path.write_text(WORKSPACE_YAML, encoding="utf-8")
    return path
