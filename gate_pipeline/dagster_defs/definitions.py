"""The code location: every gate definition, merged. `dg dev`, `dg check defs`, `gate ui`
(`-m gate_pipeline.dagster_defs.definitions`) and the tests load `defs` from here."""
from __future__ import annotations

from datetime import timedelta

import dagster as dg

from .assets import agent_episode, staging_batches
from .checks import contract_check
from .jobs import NIGHTLY_JOBS, play_case_job
from .resources import default_resources
from .schedules import nightly_schedule
from .scoreboard import scoreboard
from .sensors import case_partitions_sensor, failed_run_sensor, grading_sensor

# a scoreboard older than a day is stale (the schedule makes one every night), two days late is a failure
SCOREBOARD_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=2), warn_window=timedelta(days=1))

defs = dg.Definitions.merge(
    dg.Definitions(assets=[staging_batches, agent_episode,
                           scoreboard.map_asset_specs(lambda spec: dg.apply_freshness_policy(spec,
                                                                                             SCOREBOARD_FRESHNESS))],
                   asset_checks=[contract_check]),
    dg.Definitions(jobs=[play_case_job, *NIGHTLY_JOBS]),
    dg.Definitions(sensors=[grading_sensor, failed_run_sensor, case_partitions_sensor], schedules=[nightly_schedule]),
    dg.Definitions(resources=default_resources(), executor=dg.in_process_executor),
)


def nightly_multiprocess_job() -> dg.JobDefinition:
    """The multiprocess nightly job, as `dg.reconstructable` needs it (a module-level function)."""
    return defs.resolve_job_def("nightly_benchmark_multiprocess")


def nightly_celery_job() -> dg.JobDefinition:
    """The Celery nightly job, as `dg.reconstructable` needs it (the `celery` extra installed)."""
    return defs.resolve_job_def("nightly_benchmark_celery")
