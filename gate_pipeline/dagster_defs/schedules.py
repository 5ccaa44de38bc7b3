"""The nightly benchmark schedule: 02:00 UTC, the job's default configuration."""
from __future__ import annotations

import dagster as dg

from .jobs import nightly_job

nightly_schedule = dg.ScheduleDefinition(
    name="nightly_benchmark_schedule", cron_schedule="0 2 * * *", execution_timezone="UTC", target=nightly_job,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="The nightly benchmark at 02:00 UTC: eval cases x naive, careful, refuse-all.")
