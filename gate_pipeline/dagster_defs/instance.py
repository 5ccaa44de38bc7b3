"""The Dagster instance `gate ui` runs on: run monitoring on, telemetry off; its storage (runs,
events, schedules) in SQLite files in DAGSTER_HOME, or, when GATE_DB_URL names a PostgreSQL
database, in that database, through dagster-postgres (the `postgres` extra): then every machine
whose dagster.yaml points there sees the same runs, and the file is readable by its owner only,
since it holds the URL (password included).

`gate ui` writes `dagster.yaml` when the directory has none, or when the one there is gate's
own (its first line is MARKER); a `dagster.yaml` someone wrote by hand is left as it is, and
`gate ui` says which of gate's settings it lacks.

Run monitoring (Dagster's daemon): a run that has not started within START_TIMEOUT_S fails; a
run still going past its maximum runtime fails, which is how a run whose worker died with its code
server (or the machine) ends: Dagster's default run launcher cannot ask a worker's health. The
maximum runtime is the run's `dagster/max_runtime` tag (every gate job sets one, see jobs.py), else
the instance's `max_runtime_seconds` (MAX_RUNTIME_S unless `gate ui --max-runtime` says otherwise):
the backstop of the runs no job tags, the asset page's and backfills' `__ASSET_JOB` runs. Both are
checked every POLL_INTERVAL_S. When such a run fails, `failed_run_sensor` closes its open episodes
and the grading sensor grades them 0 with the reason.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

MARKER = "# written by gate ui: delete this line to keep your own edits"
POLL_INTERVAL_S = 15
START_TIMEOUT_S = 180
CANCEL_TIMEOUT_S = 180
MAX_RUNTIME_S = 1800  # a model playing one case; the play_case job's own tag (jobs.py)

SQLITE_STORAGE = "# SQLite run, event and schedule storage in this directory (Dagster's default).\n"
INSTANCE_YAML = f"""{MARKER}
{{storage}}telemetry:
  enabled: false
run_monitoring:
  enabled: true
  poll_interval_seconds: {POLL_INTERVAL_S}
  start_timeout_seconds: {START_TIMEOUT_S}
  cancel_timeout_seconds: {CANCEL_TIMEOUT_S}
  max_runtime_seconds: {{max_runtime}}
"""

REQUIRED = {"run_monitoring": "runs whose worker died stay STARTED",
            "telemetry": "Dagster's telemetry is on"}
MAX_RUNTIME_KEY = "max_runtime_seconds"


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


def instance_yaml(db_url: str | None = None, max_runtime: int = MAX_RUNTIME_S) -> str:
    """gate's dagster.yaml: Dagster's storage in PostgreSQL when `db_url` is a PostgreSQL URL; runs without
    a `dagster/max_runtime` tag of their own fail after `max_runtime` seconds (0: never)."""
    pg = postgres_url(db_url)
    text = INSTANCE_YAML.replace("{max_runtime}", str(int(max_runtime)))
    if pg is None:
        return text.replace("{storage}", SQLITE_STORAGE)
    storage = ("# runs, events and schedules in the run store's PostgreSQL database (GATE_DB_URL), through\n"
               "# dagster-postgres\n"
               f"storage:\n  postgres:\n    postgres_url: {json.dumps(pg)}\n")
    return text.replace("{storage}", storage)


def prepare_instance_dir(home: Path, db_url: str | None = None, max_runtime: int = MAX_RUNTIME_S) -> list[str]:
    """Write gate's dagster.yaml into `home` unless someone else's is there; return warnings."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    try:
        existing = path.read_text(encoding="utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        return [f"cannot read {path} ({exc}); Dagster will report what is wrong with it"]
    if existing is None or existing.startswith(MARKER):
        wanted = instance_yaml(db_url, max_runtime)
        if existing != wanted:
            tmp = path.with_name(f".dagster.yaml.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold a password
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(wanted)
            os.replace(tmp, path)
        return []
    kept = f"{path} is not gate's, so it is kept as it is"
    out = [f"{kept}; it has no `{key}` section: {why}" for key, why in REQUIRED.items() if not _has_section(existing, key)]
    if _has_section(existing, "run_monitoring") and not _has_key(existing, MAX_RUNTIME_KEY):
        out.append(f"{kept}; its `run_monitoring` has no `{MAX_RUNTIME_KEY}`: runs launched from an asset page or a "
                   f"backfill whose worker died stay STARTED")
    return out


def _has_section(text: str, key: str) -> bool:
    return any(line.split("#", 1)[0].rstrip() == f"{key}:" or line.startswith(f"{key}: ")
               for line in text.splitlines())


def _has_key(text: str, key: str) -> bool:
    """Whether an indented `key:` is set anywhere (gate looks no further into a YAML it did not write)."""
    return any(line[:1].isspace() and line.split("#", 1)[0].strip().startswith(f"{key}:") for line in text.splitlines())


LOCATION = "gate"
MODULE, ATTRIBUTE = "gate_pipeline.dagster_defs.definitions", "defs"
WORKSPACE_YAML = f"""# written by gate ui (rewritten at every start): gate's code location, served by the code server gate ui
# runs on 127.0.0.1:{{port}} (`dagster code-server start -m {MODULE} -a {ATTRIBUTE} --location-name {LOCATION}`)
load_from:
  - grpc_server:
      host: 127.0.0.1
      port: {{port}}
      location_name: {LOCATION}
"""


def write_workspace(home: Path, port: int) -> Path:
    """The workspace file `gate ui`'s webserver and daemon load: the code location `gate` (as in the
    repository's workspace.yaml), from the code server `gate ui` keeps running on `port`."""
    path = home / "gate-workspace.yaml"
    text = WORKSPACE_YAML.replace("{port}", str(int(port)))
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path
