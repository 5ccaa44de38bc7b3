"""The nightly job on a real Celery cluster equals the nightly in process.

A Redis broker and two `dagster-celery` workers on 127.0.0.1, and PostgreSQL for the run store and
Dagster's storage (tests/servers.py starts each in a process group and stops it). The workers are
set up as other machines would be: a GATE_HOME and DAGSTER_HOME of their own, sharing with the
process that runs the job only the database URL, the store's key and the broker.
"""
from __future__ import annotations

import json
import uuid
import warnings
from pathlib import Path

import dagster as dg
import pytest
from servers import celery_workers, need, postgres, redis

from gate_pipeline.dagster_defs import definitions
from gate_pipeline.dagster_defs.instance import prepare_instance_dir
from gate_pipeline.dagster_defs.jobs import nightly_run_config
from gate_pipeline.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
KEY = "the-store-key-every-machine-of-the-cluster-has-0123"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(database URL, broker URL, worker node names): PostgreSQL, Redis, two Celery workers."""
    need("postgresql", "redis-server")
    tmp = tmp_path_factory.mktemp("cluster")
    with postgres() as pg, redis() as broker:
        url = pg.create_database(f"gate_{uuid.uuid4().hex[:12]}")
        worker_env = {"GATE_DB_URL": url, "GATE_STORE_KEY": KEY, "GATE_HOME": str(tmp / "worker-home")}
        with celery_workers(broker, 2, tmp / "worker-dagster", env=worker_env, log_dir=tmp) as names:
            yield url, broker, names


def test_the_nightly_on_celery_equals_the_nightly_in_process(cluster, tmp_path, monkeypatch):
    url, broker, names = cluster
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "in-process"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    config = nightly_run_config(str(EVAL), chunk_size=8)
    with dg.DagsterInstance.ephemeral() as instance:
        local = definitions.defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, run_config=config).output_for_node("scoreboard")

    for name, value in {"GATE_HOME": str(tmp_path / "orchestrator"), "GATE_DB_URL": url, "GATE_STORE_KEY": KEY,
                        "GATE_CELERY_BROKER": broker}.items():
        monkeypatch.setenv(name, value)
    dagster_home = tmp_path / "dagster"
    prepare_instance_dir(dagster_home, url)  # Dagster's storage in PostgreSQL too: the workers reach it
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dagster-celery registers its task again for every step it sends
        with dg.execute_job(dg.reconstructable(definitions.nightly_celery_job), instance,
                            run_config=config) as result:
            assert result.success
            run_id = result.run_id
            ran_on = {}
            for event in result.all_events:
                worker = event.is_engine_event and (event.event_specific_data.metadata or {}).get("Celery worker")
                if worker:
                    ran_on[event.step_key] = worker.value.split("@")[0]
    chunks = [f"scoreboard.play_chunk[cases_{i:04d}]" for i in range(0, 32, 8)]
    assert set(chunks) <= set(ran_on)
    assert {ran_on[c] for c in chunks} == set(names)  # both workers played chunks
    store = RunStore()
    board = json.loads(store.get_output(run_id, "scoreboard.build_scoreboard", "result"))
    assert board["grades"] == local["grades"]
    assert board["summary"] == local["summary"]
    assert board["tables"] == local["tables"]
    assert len(store.episodes(run_id=run_id)) == 32 * 3
    for home in ("orchestrator", "in-process"):  # only the database holds the cluster's episodes
        assert not (tmp_path / home / "warehouses").exists()
