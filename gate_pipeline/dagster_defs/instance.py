"""The Dagster instance `gate ui` runs on: SQLite storage in DAGSTER_HOME, run monitoring on, telemetry off.

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

from pathlib import Path

MARKER = "# written by gate ui: delete this line to keep your own edits"
POLL_INTERVAL_S = 15
START_TIMEOUT_S = 180
CANCEL_TIMEOUT_S = 180

INSTANCE_YAML = f"""{MARKER}
# SQLite run, event and schedule storage in this directory (Dagster's default).
telemetry:
  enabled: false
run_monitoring:
  enabled: true
  poll_interval_seconds: {POLL_INTERVAL_S}
  start_timeout_seconds: {START_TIMEOUT_S}
  cancel_timeout_seconds: {CANCEL_TIMEOUT_S}
"""

REQUIRED = {"run_monitoring": "runs whose worker died stay STARTED",
            "telemetry": "Dagster's telemetry is on"}


def prepare_instance_dir(home: Path) -> list[str]:
    """Write gate's dagster.yaml into `home` unless someone else's is there; return warnings."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    try:
        existing = path.read_text(encoding="utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        return [f"cannot read {path} ({exc}); Dagster will report what is wrong with it"]
    if existing is None or existing.startswith(MARKER):
        if existing != INSTANCE_YAML:
            path.write_text(INSTANCE_YAML, encoding="utf-8")
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
