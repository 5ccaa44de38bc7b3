"""gate as a standard OpenEnv environment, used the way a stranger would use one.

- `openenv.yaml` names what the package has (its version, app, client and wire classes, suites);
- `openenv validate` (openenv-core's CLI) passes against a running `gate serve`, with a token too;
- `openenv validate .` on the checkout finds OpenEnv's layout (uv.lock, current; the `server` command;
  server/app.py with `app` and `main`) and reports only what gate decides otherwise: openenv-core is in
  the `serve` extra, not among the required dependencies (docs/serve.md says why);
- `uvicorn gate_pipeline.integrations.openenv_app:app` (and `server.app:app` in the checkout) serves the
  module-level app;
- `AutoEnv` (openenv-core's, which hands back its `GenericEnvClient` for a running server) plays
  whole episodes of every baseline and attacker of both suites, sending bare tool calls, and every
  grade equals the engine's (`gate serve --cases cases/v2/eval_curated.jsonl` for suite v2);
- the Docker image builds and serves an episode with no network (skipped where no Docker engine
  runs, with the reason).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from servers import start_server, stop_server
from wire import play_over_the_wire

from gate_pipeline.dagster_defs.webserver import free_port
from gate_pipeline.kernel import engine
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import prepare
from gate_pipeline.kernel.suite import suites

pytest.importorskip("openenv.core", reason="needs the serve extra (openenv-core)")

SUITE_CASES = {"classic": ROOT / "cases" / "classic" / "eval_curated.jsonl",
               "v2": ROOT / "cases" / "v2" / "eval_curated.jsonl"}
OPENENV = Path(sys.executable).parent / "openenv"


def stop(proc, err) -> None:
    code = stop_server(proc)
    time.sleep(0.2)
    log = "".join(err)
    assert code == 0 and "Traceback" not in log, log[-3000:]


def test_openenv_yaml_names_what_the_package_has():
    import importlib
    manifest = yaml.safe_load((ROOT / "openenv.yaml").read_text())
    assert manifest["spec_version"] == 1 and manifest["name"] == "gate" and manifest["runtime"] == "fastapi"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert manifest["version"] == pyproject["project"]["version"] == version("gate-pipeline")
    module, _, attribute = manifest["app"].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))  # uvicorn's module:attribute
    module, _, attribute = manifest["client"].partition(":")
    client_module = importlib.import_module(module)
    assert getattr(client_module, attribute).__name__ == "GateEnvClient"
    for key in ("action", "observation", "state"):
        assert hasattr(client_module, manifest[key]), key
    assert manifest["default_suite"] == suites.default().name and manifest["suites"] == suites.names()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'"--port", "{manifest["port"]}"' in dockerfile and f"EXPOSE {manifest['port']}" in dockerfile


def validate(target: str) -> dict:
    out = subprocess.run([str(OPENENV), "validate", target], capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert out.returncode == (0 if report["passed"] else 1), out.stderr
    return report


@pytest.mark.slow
@pytest.mark.skipif(not OPENENV.exists(), reason="openenv-core's `openenv` command is not installed")
def test_openenv_validate_passes_against_the_running_server():
    """openenv-core's runtime validation: /openapi.json with its version, /health, /metadata,
    /schema, a JSON-RPC answer from /mcp, and the simulation mode's /reset, /step and /state."""
    from gate_pipeline.integrations.openenv_client import with_token
    proc, url, err = start_server("--cases", str(SUITE_CASES["classic"]))
    try:
        report = validate(url)
    finally:
        stop(proc, err)
    assert report["passed"] and report["mode"] == "simulation", report
    assert sorted(c["id"] for c in report["criteria"] if c["passed"]) == [
        "health_endpoint", "mcp_endpoint", "metadata_endpoint", "mode_endpoint_consistency",
        "openapi_version_available", "schema_endpoint"]
    proc, url, err = start_server("--cases", str(SUITE_CASES["classic"]), "--token", "tok-en")
    try:
        assert not validate(url)["passed"]  # without the token every route but /health is refused
        assert validate(with_token(url, "tok-en"))["passed"]  # a token in the URL: as any HTTP client sends it
    finally:
        stop(proc, err)


# what `openenv validate .` says of the checkout: the one item gate decides otherwise (docs/serve.md)
LOCAL_ISSUES = ["Missing required dependency: openenv-core>=0.2.0 (or openenv>=0.2.0)"]
UV = shutil.which("uv", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


@pytest.mark.skipif(not OPENENV.exists(), reason="openenv-core's `openenv` command is not installed")
def test_openenv_validate_on_the_checkout_finds_openenvs_layout():
    """openenv-core's local check: uv.lock, a `server` script naming a main(), openenv-core among the
    required dependencies, server/app.py with a main() called under `if __name__ == "__main__"`."""
    out = subprocess.run([str(OPENENV), "validate", ".", "--json"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    report = json.loads(out.stdout)
    assert report["issues"] == LOCAL_ISSUES and out.returncode == 1, (report, out.stderr)
    # and the layout it found is gate's own: the script is `gate serve`, server/app.py re-exports the app
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["server"] == "gate_pipeline.cli.start:main"
    bad_port = subprocess.run([sys.executable, "server/app.py", "--port", "x"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
    assert bad_port.returncode == 2 and bad_port.stderr.startswith("gate: error: --port"), bad_port.stderr
    installed = Path(sys.executable).parent / "server"
    if installed.exists():  # a virtualenv installed from this pyproject.toml
        again = subprocess.run([str(installed), "--port", "x"], capture_output=True, text=True, timeout=120)
        assert (again.returncode, again.stderr) == (bad_port.returncode, bad_port.stderr)


@pytest.mark.slow
@pytest.mark.skipif(UV is None, reason="uv is not installed (pip install uv): uv.lock cannot be checked")
def test_uv_lock_is_current_with_pyproject():
    """uv.lock (OpenEnv's layout has one) resolves pyproject.toml's dependencies as they are now; after a
    change to them, `uv lock` writes it again."""
    out = subprocess.run([UV, "lock", "--check"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gate_pipeline.integrations.openenv_app:app", "server.app:app"])
def test_uvicorn_serves_the_module_level_app(target):
    from openenv.core import GenericEnvClient
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", target,
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "GATE_SERVE_TOKEN": ""}, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    assert json.loads(r.read()) == {"status": "healthy"}
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        train = read_cases(ROOT / "cases" / "classic" / "train_procedural.jsonl")
        with GenericEnvClient(base_url=url).sync() as env:
            first = env.reset(case_id=train[0].case_id)
            assert first.observation["prompt"] == train[0].prompt and first.observation["tools"]
            listing = json.loads(env.step({"tool": "list_batches"}).observation["result"])
            assert {b["batch_id"] for b in listing} == set(prepare(train[0]).batches)
            state = env.state()
        assert state["trainer"] is False and state["step_count"] == 1  # no token: no trainer-only fields
    finally:
        stop_server(proc)


def one_case_per_family(path) -> list:
    seen = {}
    for case in read_cases(path):
        seen.setdefault(case.family, case)
    return list(seen.values())


@pytest.mark.slow
@pytest.mark.parametrize("suite", sorted(SUITE_CASES))
def test_autoenv_plays_every_baseline_and_attacker_with_bare_tool_calls_graded_as_the_engine(suite):
    """AutoEnv, for a running server, gives openenv-core's GenericEnvClient: it sends a step's dict
    as it is, so each call goes out bare (`{"tool": name, "args": {...}}`), as a model writes it."""
    from openenv import AutoEnv
    from openenv.core import GenericEnvClient

    from gate_pipeline.model_agent.tool_schemas import tool_schemas
    the_suite = suites.get(suite)
    agents = sorted(set(the_suite.report_agents) | set(the_suite.attack_agents))
    cases = one_case_per_family(SUITE_CASES[suite])
    proc, url, err = start_server("--cases", str(SUITE_CASES[suite]), "--trainer-state")
    grades = set()
    try:
        client = AutoEnv.from_env("gate", base_url=url, skip_install=True)
        assert isinstance(client, GenericEnvClient)
        with client.sync() as env:
            first = env.reset(case_id=cases[0].case_id)
            assert first.observation["tools"] == tool_schemas(the_suite)  # the catalogue `gate run` sends
            for case in cases:
                for agent in agents:
                    play_over_the_wire(env, case, agent, max_turns=256)
                    want = engine.play(prepare(case), agent).grade.as_dict()
                    got = env.state()["grade"]
                    assert got == want, (suite, case.case_id, agent)
                    grades.add(want["reward"])
    finally:
        stop(proc, err)
    assert len(grades) >= 5 and min(grades) < 0.5 and max(grades) == 1.0, grades  # grades that differ


def docker_engine() -> str | None:
    """Why no Docker engine can build here, or None when one answers."""
    exe = shutil.which("docker")
    if exe is None:
        return "docker is not installed"
    out = subprocess.run([exe, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 0:
        return f"no Docker engine answers here ({(out.stderr.strip().splitlines() or ['docker version failed'])[-1]})"
    return None


CONTAINER_EPISODE = """
import json, subprocess, sys, time, urllib.request
server = subprocess.Popen(["gate", "serve", "--port", "8000", "--trainer-state"])
for _ in range(300):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=1); break
    except OSError:
        time.sleep(0.2)
from gate_pipeline.integrations.openenv_client import GateEnvClient
with GateEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
    env.reset(seed=7)
    ids = [b["batch_id"] for b in json.loads(env.call("list_batches").observation.result)]
    for bid in ids:
        env.call("load_batch", batch_id=bid)
    env.call("submit_report", loaded=ids, quarantined=[])
    print(json.dumps(env.state().grade))
server.terminate(); server.wait(timeout=30)
"""


@pytest.mark.slow
@pytest.mark.skipif(docker_engine() is not None, reason=f"the Docker image cannot be built: {docker_engine()}")
def test_the_docker_image_builds_and_serves_an_episode_with_no_network():
    tag = f"gate-env-test:{os.getpid()}"
    build = subprocess.run(["docker", "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stderr[-3000:]
    try:
        refused = subprocess.run(["docker", "run", "--rm", "--network", "none", tag], capture_output=True, text=True,
                                 timeout=300)  # the image's command: 0.0.0.0, so a token is required
        assert refused.returncode == 2 and "give a token" in refused.stderr, refused
        run = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "python", "-c", CONTAINER_EPISODE],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        grade = json.loads(run.stdout.strip().splitlines()[-1])
        assert grade["finished"] and 0.0 <= grade["reward"] <= 1.0
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=300)
