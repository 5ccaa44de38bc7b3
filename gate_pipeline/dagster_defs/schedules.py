"""The nightly benchmark schedule: 02:00 UTC, the job's default configuration.

On by default (so is every sensor): a `gate ui` left running plays the nightly benchmark at
night. Turn it off in the UI (Automation, the schedule, Stop), or set GATE_NIGHTLY_SCHEDULE=off
in the environment of `gate ui` (the schedule then starts stopped)."""
from __future__ import annotations

import dagster as dg

from ..settings import Settings
from .jobs import nightly_job, nightly_tags

nightly_schedule = dg.ScheduleDefinition(
    name="nightly_benchmark_schedule", cron_schedule="0 2 * * *", execution_timezone="UTC", target=nightly_job,
    tags=nightly_tags(None, ["naive", "careful", "refuse-all"]),
    default_status=(dg.DefaultScheduleStatus.RUNNING if Settings.from_env().nightly_schedule
                    else dg.DefaultScheduleStatus.STOPPED),
    description="The nightly benchmark at 02:00 UTC: the classic eval cases x naive, careful, refuse-all.")
