"""One engine under every surface: every non-model agent gets the same per-case grade from
`gate report`, the nightly job, a Dagster case run, the gymnasium env and `gate replay` of the
calls it made, and a replay line is accepted or refused identically by `gate replay` and the env."""
from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.dagster_defs.definitions import defs
from gate_pipeline.dagster_defs.jobs import nightly_run_config, play_case_run_config
from gate_pipeline.dagster_defs.partitions import cases_partitions
from gate_pipeline.integrations.gymnasium_env import GateEnv
from gate_pipeline.kernel.agents import agent_names, make_agent
from gate_pipeline.kernel.cases import Case, CaseLines, read_cases
from gate_pipeline.kernel.grading import grade_stored
from gate_pipeline.kernel.variants import load_variant, variant_agent_name, variant_names
from gate_pipeline.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
AGENTS = [a for a in agent_names() if a != "model"] + [variant_agent_name(load_variant(v)) for v in variant_names()]
CASES = read_cases(EVAL)


def json_out(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """gate report --json: {agent: [grade dict per eval case]}."""
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["report", "--cases", str(EVAL), "--agents", ",".join(AGENTS), "--json"]) == 0
    return json.loads(buf.getvalue())["agents"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.setenv("GATE_CASES_DIR", str(ROOT / "cases"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    return tmp_path / "gate"


def test_every_registered_agent_is_covered(reported):
    assert "random" in AGENTS and "careful@full" in AGENTS and "citation-spray" in AGENTS
    assert sorted(reported) == sorted(AGENTS) and all(len(gs) == len(CASES) for gs in reported.values())


def test_the_nightly_job_grades_every_agent_as_gate_report_does(reported, home):
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, run_config=nightly_run_config(str(EVAL), AGENTS))
    assert result.success
    board = result.output_for_node("scoreboard")["grades"]
    assert board == reported


def test_a_dagster_case_run_grades_as_gate_report_does(reported, home):
    """Each agent on two cases (all 32 cases covered across agents): one Dagster run each, graded
    from the run store as the grading sensor grades it."""
    store = RunStore()
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(cases_partitions.name, [c.case_id for c in CASES])
        for i, agent in enumerate(AGENTS):
            for k in (i % len(CASES), (i + len(CASES) // 2) % len(CASES)):
                run = defs.resolve_job_def("play_case").execute_in_process(
                    instance=instance, partition_key=CASES[k].case_id,
                    run_config=play_case_run_config(agent), raise_on_error=False)
                episodes = store.episodes(run_id=run.run_id)
                assert len(episodes) == 1, (agent, CASES[k].case_id)
                g = grade_stored(store.load(episodes[0]["episode_id"]))
                assert g.as_dict() == reported[agent][k], (agent, CASES[k].case_id)


def play_in_env(env: GateEnv, agent_name: str, case: Case) -> tuple[dict, list]:
    """Play an agent through GateEnv.step: its final grade and the actions it sent, as JSON text."""
    agent = make_agent(agent_name)
    env.reset(options={"case_id": case.case_id})
    sent, last = [], {}

    class Tools:
        episode_seed = env.session.episode_seed
        suite = env.pool.suite  # the episode's suite, as the engine's tools give it
        tool_names = suite.tool_names

        def __call__(self, name, **args):
            return self.act({"tool": name, "args": args})

        def act(self, action):
            text = json.dumps(action)
            sent.append(text)
            obs, reward, terminated, truncated, info = env.step(text)
            last.update(info)
            assert json.loads(obs["result"]) == json.loads(info["result"])
            return json.loads(info["result"])

    agent.play(Tools(), case.data if agent.oracle else None)
    return json.loads(last["grade"]), sent


def test_the_gym_env_and_a_replay_of_its_calls_grade_as_gate_report_does(reported, tmp_path, capsys):
    env = GateEnv(CASES, max_turns=10_000)
    lines = []
    for agent in AGENTS:
        for k, case in enumerate(CASES):
            grade, sent = play_in_env(env, agent, case)
            assert grade == reported[agent][k], (agent, case.case_id)
            lines.append({"case_id": case.case_id, "calls": sent})
    trajectories = tmp_path / "calls.jsonl"
    trajectories.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["replay", "--cases", str(EVAL), "--trajectories", str(trajectories), "--json"]) == 0
    replayed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = [reported[agent][k] for agent in AGENTS for k in range(len(CASES))]
    assert [r["grade"] for r in replayed] == expected


LINES = [
    ["list_batches", {}],
    ["list_batches"],
    {"tool": "list_batches"},
    {"tool": "profile_batch", "args": "{\"batch_id\": \"B-0930-60-1\"}"},
    "{\"tool\": \"read_contract\", \"args\": {}}",
    {"tool": "run_sql", "args": {"query": "SELECT 1"}, "extra": 1},
    {"args": {}},
    ["run_sql", "{\"query\": "],
    ["run_sql", "[1, 2]"],
    ["load_batch", {"batch_id": 7}],
    ["no_such_tool", {}],
    [],
    ["a", {}, "b"],
    42,
    None,
    "not json",
    {"tool": ["list_batches"], "args": {}},
]


def test_a_replay_line_is_accepted_or_refused_as_the_env_does(tmp_path, capsys):
    case = CASES[0]
    path = tmp_path / "lines.jsonl"
    path.write_text(json.dumps({"case_id": case.case_id, "calls": LINES}) + "\n")
    assert main(["replay", "--cases", str(EVAL), "--trajectories", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    env = GateEnv([case])
    env.reset(options={"case_id": case.case_id})
    from_env = [json.loads(env.step(action)[4]["result"]) for action in LINES]
    assert out["results"] == from_env
    accepted = ["error" not in r for r in from_env]
    assert accepted[:5] == [True] * 5 and not any(accepted[5:])
    assert [e["executed"] for e in out["ledger"]] == accepted


def test_forked_workers_play_exactly_what_one_process_plays():
    cases = read_cases(ROOT / "cases" / "classic" / "train_procedural.jsonl")[:24]
    from gate_pipeline.kernel.engine import play_cases
    agents = ["random", "careful@full", "careful-sql", "report-liar"]
    text = "".join(c.line() for c in cases).replace("\n", "\n\n", 3)  # blank lines too
    one, many = play_cases(cases, agents), play_cases(cases, agents, workers=3)
    parsed_there = play_cases(CaseLines(text, "x.jsonl"), agents, workers=3)  # each worker parses its share
    assert list(one) == list(many) == list(parsed_there)
    for name in agents:
        assert [(r.case_id, r.grade, r.ledger, r.rewards) for r in one[name]] == \
               [(r.case_id, r.grade, r.ledger, r.rewards) for r in many[name]] == \
               [(r.case_id, r.grade, r.ledger, r.rewards) for r in parsed_there[name]]


def test_workers_shares_cover_every_case_once_in_order_as_even_as_can_be():
    from gate_pipeline.kernel.cases import contiguous
    lines = [json.dumps({"n": k}) for k in range(11)]
    text = "\n".join(line + "\n" * (1 + k % 3) for k, line in enumerate(lines))  # blank lines between
    case_lines = CaseLines(text, "x.jsonl")
    for count in range(1, 13):
        for parts in range(1, count + 1):
            shares = contiguous(count, parts)
            assert shares[0][0] == 0 and shares[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
            assert max(b - a for a, b in shares) - min(b - a for a, b in shares) <= 1
    for parts in range(1, 12):  # a share of the lines holds the cases of the same share of the cases
        bounds = case_lines.bounds(parts)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(case_lines.lines)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        held = [[k for k in case_lines.at if start <= k < stop] for start, stop in bounds]
        assert [len(h) for h in held] == [b - a for a, b in contiguous(11, parts)]
