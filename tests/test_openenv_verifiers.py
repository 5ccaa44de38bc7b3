"""verifiers 0.4's built-in `openenv` taskset plays a case against `gate serve` to a grade.

verifiers 0.4 pins openai below 3 and gate pins openai 3, so the test installs
`verifiers[openenv]==0.4.0` in a virtual environment of its own (kept in pytest's cache
directory, `.pytest_cache/d/verifiers-0.4`, with `uv`, which its harness runs, and reused);
where it cannot be installed (no package registry) the test is skipped with pip's reason. Its `vf-eval` runs the taskset with the
tool-less `null` harness on the local `subprocess` runtime against a real chat-completions server
on 127.0.0.1 whose model answers in text, one JSON tool call per reply, as naive plays (list the
batches, load each, report): the taskset shows the model the reset observation (with gate's tool
catalogue) and the action schema, sends each reply as the step's action (a bare tool call), and
scores the episode's step rewards: the rubric's reward, which must equal the engine's grade. The
server has a token, which the taskset's `base_url` carries (`http://gate:<token>@host:port`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import EVAL
from servers import start_server, stop_server

from gate_pipeline.kernel import engine
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import prepare

pytest.importorskip("openenv.core", reason="needs the serve extra (openenv-core)")
from gate_pipeline.integrations.openenv_client import with_token  # noqa: E402

VERIFIERS = "verifiers[openenv]==0.4.0"
UV = "uv>=0.5"  # the null harness runs its chat program as a uv script (verifiers would download uv otherwise)
TOKEN = "verifiers-token"


def naive_text_policy(messages: list) -> dict:
    """naive, from the conversation alone: list the batches, load each one, report them loaded."""
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if turn == 0:
        return {"tool": "list_batches", "args": {}}
    users = [m for m in messages if m.get("role") == "user"]
    listing = json.loads(json.loads(users[1]["content"])["observation"]["result"])
    ids = [b["batch_id"] for b in listing]
    if turn <= len(ids):
        return {"tool": "load_batch", "args": {"batch_id": ids[turn - 1]}}
    return {"tool": "submit_report", "args": {"loaded": ids, "quarantined": []}}


class TextModel(BaseHTTPRequestHandler):
    """Chat completions (plain or streamed) whose reply is the policy's tool call as JSON text."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        self.server.requests.append(body)
        content = json.dumps(naive_text_policy(body.get("messages", [])))
        created, model = int(time.time()), body.get("model", "text-model")
        if body.get("stream"):
            def chunk(delta, finish=None, **extra):
                return {"id": "c", "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else [],
                        **extra}
            events = [chunk({"role": "assistant", "content": content}), chunk({}, "stop"),
                      chunk(None, usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})]
            raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            kind = "text/event-stream"
        else:
            raw = json.dumps({"id": "c", "object": "chat.completion", "created": created, "model": model,
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": content}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def verifiers_venv(cache_dir: Path) -> Path:
    """`vf-eval` of verifiers 0.4 in its own virtual environment (made once); skip if it cannot be."""
    vf_eval = cache_dir / "bin" / "vf-eval"
    if vf_eval.exists() and (cache_dir / "bin" / "uv").exists():
        return vf_eval
    made = subprocess.run([sys.executable, "-m", "venv", str(cache_dir)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a virtual environment for verifiers 0.4: {made.stderr.strip()[-300:]}")
    try:
        pip = subprocess.run([str(cache_dir / "bin" / "python"), "-m", "pip", "install", "-q", VERIFIERS, UV],
                             capture_output=True, text=True, timeout=1500)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip install {VERIFIERS} took over 25 minutes")
    if pip.returncode != 0 or not vf_eval.exists():
        why = [line for line in pip.stderr.splitlines() if "ERROR" in line or "error" in line] or ["no vf-eval"]
        pytest.skip(f"cannot install {VERIFIERS} (its openai pin clashes with gate's, so it needs a virtual "
                    f"environment of its own): {why[-1][:300]}")
    return vf_eval


@pytest.mark.slow
def test_verifiers_openenv_taskset_plays_a_case_against_gate_serve_to_the_engines_grade(request, tmp_path):
    vf_eval = verifiers_venv(request.config.cache.mkdir("verifiers-0.4"))
    home = request.config.cache.mkdir("verifiers-0.4-home")  # its caches (uv's, verifiers' runtimes), kept
    case = next(c for c in read_cases(EVAL) if c.case_id == "eval-amount-bounds-0")  # naive loads a bad batch
    want = engine.play(prepare(case), "naive").grade
    model = ThreadingHTTPServer(("127.0.0.1", 0), TextModel)
    model.requests = []
    threading.Thread(target=model.serve_forever, daemon=True).start()
    proc, url, err = start_server("--cases", str(EVAL), "--token", TOKEN)
    try:
        (tmp_path / "eval.toml").write_text(f"""
model = "text-model"
num_rollouts = 1

[env.taskset]
id = "openenv"
base_url = "{with_token(url, TOKEN)}"
resets = [{{case_id = "{case.case_id}"}}]

[env.player]
harness = {{id = "null"}}
runtime = {{type = "subprocess"}}

[client]
base_url = "http://127.0.0.1:{model.server_address[1]}/v1"
api_key_var = "GATE_TEST_MODEL_KEY"
""")
        run = subprocess.run([str(vf_eval), "@", "eval.toml"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=900, env={**os.environ, "PATH": f"{vf_eval.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                                               "HOME": str(home), "GATE_TEST_MODEL_KEY": "unused"})
    finally:
        model.shutdown()
        code = stop_server(proc)
    log = "".join(err)
    assert code == 0 and "Traceback" not in log, log[-2000:]
    traces = list(tmp_path.glob("outputs/*/traces.jsonl"))
    assert run.returncode == 0 and len(traces) == 1, (run.stdout[-3000:], run.stderr[-3000:])
    episodes = [json.loads(line) for line in traces[0].read_text().splitlines()]
    assert len(episodes) == 1 and episodes[0]["ok"], (episodes[0]["errors"], [t["errors"] for t in episodes[0]["traces"]])
    trace = episodes[0]["traces"][0]
    assert trace["rewards"]["openenv_reward"]["score"] == want.reward and want.bad_batches_loaded == 1  # as the engine
    # what the model was shown: the reset observation with gate's tool catalogue, and the action schema
    first = json.loads([m for m in model.requests[0]["messages"] if m["role"] == "user"][0]["content"])
    assert first["observation"]["prompt"] == case.prompt and first["action_schema"]["title"] == "GateAction"
    assert [t["function"]["name"] for t in first["observation"]["tools"]][:2] == ["read_contract", "list_batches"]
    assert len(model.requests) == 2 + len(prepare(case).batches)  # list, a load per batch, the report
