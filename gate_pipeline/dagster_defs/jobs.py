"""Jobs: play one case (a partition) with a configured agent; the nightly benchmark.

Both run their steps in one process by default (`in_process_executor`: Dagster's per-step
process costs about 2 s here, an episode a few milliseconds). `nightly_benchmark_multiprocess`
is the same nightly job on Dagster's multiprocess executor, one process per chunk of cases, and
`nightly_benchmark_celery` the same on a Celery cluster (dagster-celery's executor: each step a
task on the broker at GATE_CELERY_BROKER, run by whichever `dagster-celery worker` takes it; the
`celery` extra). See docs/many-machines.md.

Every run of these jobs carries a maximum runtime (the `dagster/max_runtime` tag, in seconds): with
the run monitoring `gate ui` turns on, a run whose worker is gone (a crash, a reboot) is failed once
it passes it, and the grading sensor then grades its open episodes 0 with the reason. Set the tag
on a launch to allow longer (a model playing many cases). The runs no job tags (the asset page's
and backfills' `__ASSET_JOB`) get the instance's `max_runtime_seconds` (instance.py).
"""
from __future__ import annotations

import dagster as dg

from .assets import CASE_GROUP
from .instance import MAX_RUNTIME_S
from .location import run_settings
from .scoreboard import NIGHTLY_GROUP

CASE_MAX_RUNTIME_S = MAX_RUNTIME_S  # a model playing one case
NIGHTLY_MAX_RUNTIME_S = 6 * 3600

play_case_job = dg.define_asset_job(
    "play_case", selection=dg.AssetSelection.groups(CASE_GROUP), executor_def=dg.in_process_executor,
    tags={"dagster/max_runtime": str(CASE_MAX_RUNTIME_S)},
    description="Stage a case, run the contract check and let the configured agent play it.")

nightly_job = dg.define_asset_job(
    "nightly_benchmark", selection=dg.AssetSelection.groups(NIGHTLY_GROUP), executor_def=dg.in_process_executor,
    tags={"dagster/max_runtime": str(NIGHTLY_MAX_RUNTIME_S)},
    description="Every case of the configured case file x the configured agents; materializes the scoreboard.")

nightly_multiprocess_job = dg.define_asset_job(
    "nightly_benchmark_multiprocess", selection=dg.AssetSelection.groups(NIGHTLY_GROUP),
    executor_def=dg.multiprocess_executor.configured({"max_concurrent": 2}),
    tags={"dagster/max_runtime": str(NIGHTLY_MAX_RUNTIME_S)},
    description="The nightly benchmark with one process per step (chunk of cases).")


def celery_config(broker: str) -> dict:
    """dagster-celery's executor config for a broker URL: a Redis broker is also the result backend."""
    backend = broker if broker.startswith(("redis://", "rediss://")) else "rpc://"
    return {"broker": broker, "backend": backend}


def _broker_at_launch(config: dict) -> dict:
    """The executor's config when a run starts: the broker given at launch, else GATE_CELERY_BROKER."""
    return celery_config(config.get("broker") or run_settings().celery_broker)


def _celery_job() -> dg.JobDefinition | None:
    try:
        from dagster_celery import celery_executor
    except ImportError:  # the `celery` extra is not installed: no Celery job
        return None
    executor = celery_executor.configured(
        _broker_at_launch, config_schema={"broker": dg.Field(str, is_required=False,
                                                             description="default: GATE_CELERY_BROKER")})
    return dg.define_asset_job(
        "nightly_benchmark_celery", selection=dg.AssetSelection.groups(NIGHTLY_GROUP), executor_def=executor,
        tags={"dagster/max_runtime": str(NIGHTLY_MAX_RUNTIME_S)},
        description="The nightly benchmark with each step (chunk of cases) a Celery task, run by the "
                    "workers listening on the broker at GATE_CELERY_BROKER.")


nightly_celery_job = _celery_job()
NIGHTLY_JOBS = [j for j in (nightly_job, nightly_multiprocess_job, nightly_celery_job) if j is not None]


def nightly_run_config(cases_file: str | None = None, agents: list[str] | None = None,
                       agent_options: dict | None = None, chunk_size: int | None = None) -> dict:
    """Run config for the nightly jobs (unset values keep the job's defaults)."""
    config = {k: v for k, v in {"cases_file": cases_file, "agents": agents, "agent_options": agent_options,
                                "chunk_size": chunk_size}.items() if v is not None}
    return {"ops": {"scoreboard": {"ops": {"plan_nightly": {"config": config}}}}}


def nightly_tags(cases_file: str | None, agents: list[str] | None) -> dict:
    """Run tags the Runs page can filter nightly runs by."""
    from pathlib import Path
    tags = {"gate/cases": Path(cases_file).name if cases_file else "the default eval split"}
    if agents:
        tags["gate/agents"] = ",".join(agents)[:255]
    return tags


def play_case_run_config(agent: str, agent_options: dict | None = None) -> dict:
    return {"ops": {"agent_episode": {"config": {"agent": agent, "agent_options": agent_options or {}}}}}
