"""The nightly benchmark schedule: 02:00 UTC, the job's default configuration.

On by default (so is every sensor): a `gate ui` left running plays the nightly benchmark at
night. Turn it off in the UI (Automation, the schedule, Stop), or set GATE_NIGHTLY_SCHEDULE=off
in the environment of `gate ui` (the schedule then starts stopped)."""
from __future__ import annotations

import dagster as dg

from ..kernel.suite import suites
from .jobs import nightly_job, nightly_tags
from .location import SETTINGS

nightly_schedule = dg.ScheduleDefinition(
    name="nightly_benchmark_schedule", cron_schedule="0 2 * * *", execution_timezone="UTC", target=nightly_job,
    tags=nightly_tags(None, list(suites.default().report_agents)),
    default_status=(dg.DefaultScheduleStatus.RUNNING if SETTINGS.nightly_schedule
                    else dg.DefaultScheduleStatus.STOPPED),
    description=f"The nightly benchmark at 02:00 UTC: the default suite's eval cases x "
                f"{', '.join(suites.default().report_agents)}.")
