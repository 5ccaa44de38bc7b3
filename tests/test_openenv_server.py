"""`gate serve` as a real server process on 127.0.0.1, played through `GateEnvClient` over
OpenEnv's protocol: careful-sql's episodes grade as in process, sessions are isolated, malformed
actions are error observations, every reward mode pays what the engine pays, bad resets and bad
input are clear errors, and the server stops cleanly without a traceback in its log."""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import EVAL, TRAIN
from servers import start_server, stop_server
from wire import WireTools, play_over_the_wire, recorded

from gate_pipeline.kernel import engine
from gate_pipeline.kernel.agents import make_agent
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import prepare

pytest.importorskip("openenv.core", reason="needs the serve extra (openenv-core)")
from websockets.asyncio.client import connect  # noqa: E402  (openenv-core's dependency)
from websockets.exceptions import ConnectionClosed  # noqa: E402

from gate_pipeline.integrations.openenv_client import GateAction, GateEnvClient  # noqa: E402

CASES = read_cases(EVAL)
BY_ID = {c.case_id: c for c in CASES}
MAX_SESSIONS = 6


@pytest.fixture(scope="module")
def server():
    proc, url, err = start_server("--cases", str(EVAL), "--max-sessions", str(MAX_SESSIONS), "--trainer-state")
    try:
        yield url
    finally:
        code = stop_server(proc)
        time.sleep(0.2)  # let the reader thread take the last lines
        log = "".join(err)
        assert code == 0 and "stopped (SIGTERM)" in log, log[-3000:]
        assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def run(coro):
    return asyncio.run(coro)


def careful_sql(case) -> tuple[list, dict]:
    """careful-sql's calls on a case, played in process, and the grade `engine.play` gives it (1.0)."""
    actions, grade = recorded(case, "careful-sql")
    assert grade["reward"] == 1.0
    return actions, grade


# -- the grade over the wire is the engine's grade ------------------------------------------------

def test_careful_sql_through_the_client_grades_as_in_process(server):
    with GateEnvClient(base_url=server).sync() as env:
        for case in CASES:
            first = env.reset(case_id=case.case_id)
            assert first.observation.turn == 0 and first.observation.result == "" and not first.done
            assert first.observation.prompt == case.prompt
            tools = WireTools(env, case)
            make_agent("careful-sql").play(tools)
            want = engine.play(prepare(case), "careful-sql")
            state = env.state()
            assert tools.steps[-1].done and not any(s.done for s in tools.steps[:-1])
            assert state.terminated and not state.truncated and state.case_id == case.case_id
            assert state.grade == want.grade.as_dict()
            assert tools.steps[-1].reward == want.grade.reward == state.rewards[-1]
            assert [s.observation.turn for s in tools.steps] == list(range(1, len(want.ledger) + 1))


WIRE_AGENTS = ("naive", "careful", "refuse-all", "profile-only", "report-liar", "report-only",
               "load-then-quarantine", "citation-spray", "sql-write", "inspect-theatre", "double-load",
               "orders-first")


def test_agents_that_fail_grade_over_the_wire_as_in_process(server):
    """careful-sql earns 1.0 on every case, so its equality alone would not show a wrong grade: the
    baselines and attackers, whose grades differ from 1 and from each other, grade over the wire as
    `engine.play` grades them (the oracles get the case from the trainer's side, as in process)."""
    families = {}
    for case in CASES:
        families.setdefault(case.case_id.rsplit("-", 1)[0], case)
    grades = set()
    with GateEnvClient(base_url=server).sync() as env:
        for case in list(families.values())[:4]:
            for name in WIRE_AGENTS:
                play_over_the_wire(env, case, name, max_turns=256)  # citation-spray makes 88 calls
                want = engine.play(prepare(case), name).grade.as_dict()
                assert env.state().grade == want, (case.case_id, name)
                grades.add(want["reward"])
    assert len(grades) >= 4 and min(grades) < 0.5, grades


@pytest.mark.parametrize("mode", ["terminal", "dense", "potential"])
def test_each_reward_mode_pays_what_the_engine_pays(server, mode):
    case = BY_ID["eval-amount-bounds-0"]
    actions, grade = careful_sql(case)
    _, episode = engine.replay(prepare(case), actions, reward=mode)
    assert episode.grade.as_dict() == grade
    with GateEnvClient(base_url=server).sync() as env:
        env.reset(case_id=case.case_id, reward=mode)
        rewards = [env.step(GateAction(action=json.dumps(a))).reward for a in actions]
        state = env.state()
    assert state.reward_mode == mode and state.terminated
    assert rewards == episode.rewards == state.rewards
    assert state.grade == episode.grade.as_dict()
    if mode == "terminal":
        assert rewards[:-1] == [0.0] * (len(rewards) - 1) and state.step_parts is None
    else:
        assert any(r != 0.0 for r in rewards[:-1])


# -- sessions ------------------------------------------------------------------------------------

def test_two_concurrent_sessions_on_different_cases_are_isolated(server):
    a_case, b_case = BY_ID["eval-resent-rows-0"], BY_ID["eval-blank-amount-1"]
    plays = {c.case_id: careful_sql(c) for c in (a_case, b_case)}

    async def episode(case_id, started: asyncio.Event, other: asyncio.Event):
        async with GateEnvClient(base_url=server) as env:
            await env.reset(case_id=case_id, reward="potential")
            started.set()
            await other.wait()  # both episodes are open before either steps
            listing = None
            for action in plays[case_id][0]:
                result = await env.step(action)
                if action["tool"] == "list_batches":
                    listing = json.loads(result.observation.result)
                await asyncio.sleep(0)  # interleave the two sessions' steps
            return listing, await env.state()

    async def both():
        a_started, b_started = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(episode(a_case.case_id, a_started, b_started),
                                    episode(b_case.case_id, b_started, a_started))

    (a_list, a_state), (b_list, b_state) = run(both())
    assert {b["batch_id"] for b in a_list} == set(prepare(a_case).batches)
    assert {b["batch_id"] for b in b_list} == set(prepare(b_case).batches)
    for case, state in ((a_case, a_state), (b_case, b_state)):
        actions, grade = plays[case.case_id]
        _, want = engine.replay(prepare(case), actions, reward="potential")
        assert state.case_id == case.case_id and state.grade == grade == want.grade.as_dict()
        assert state.rewards == want.rewards


def test_a_load_in_one_session_is_not_seen_by_another_on_the_same_case(server):
    case = BY_ID["eval-clean-control-0"]
    prepared = prepare(case)
    count = {"tool": "run_sql", "args": {"query": "SELECT COUNT(*) AS n FROM wh_orders"}}

    async def both():
        async with GateEnvClient(base_url=server) as a, GateEnvClient(base_url=server) as b:
            await a.reset(case_id=case.case_id)
            await b.reset(case_id=case.case_id)
            before = json.loads((await b.step(count)).observation.result)["rows"]
            for bid in prepared.order:
                await a.call("load_batch", batch_id=bid)
            a_after = json.loads((await a.step(count)).observation.result)["rows"]
            b_after = json.loads((await b.step(count)).observation.result)["rows"]
            return before, a_after, b_after

    before, a_after, b_after = run(both())
    assert b_after == before and a_after != before


async def open_session(url, case_id, wait=10.0):
    """A client with an episode open, waiting while the server is full (it frees a place once it has
    closed a session a client left)."""
    deadline = time.monotonic() + wait
    while True:
        client = GateEnvClient(base_url=url)
        try:
            await client.reset(case_id=case_id)
            return client
        except (RuntimeError, ConnectionClosed) as exc:  # a full server says so, then hangs up
            await client.close()
            assert isinstance(exc, ConnectionClosed) or "CAPACITY_REACHED" in str(exc), exc
            assert time.monotonic() < deadline, exc
            await asyncio.sleep(0.05)


def test_sessions_beyond_max_sessions_are_refused_and_a_closed_one_frees_its_place(server):
    async def fill():
        clients = [await open_session(server, CASES[0].case_id) for _ in range(MAX_SESSIONS)]
        async with connect(server.replace("http://", "ws://") + "/ws") as extra:  # what a full server answers
            refusal = json.loads(await asyncio.wait_for(extra.recv(), 10))
        assert refusal["type"] == "error" and refusal["data"]["code"] == "CAPACITY_REACHED"
        assert refusal["data"]["max_sessions"] == MAX_SESSIONS
        await clients[0].close()
        again = await open_session(server, CASES[1].case_id)
        state = await again.state()
        for c in [again, *clients[1:]]:
            await c.close()
        return state

    assert run(fill()).case_id == CASES[1].case_id


# a query that runs until the sandbox's 2 s time budget stops it: string work inside each step
SLOW_SQL = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c WHERE "
            f"instr(upper(lower(upper(substr('{'ab' * 4000}', x % 3)))), 'zz') > x")


def test_budget_long_queries_in_other_sessions_hold_up_a_step_by_a_slice_at_most(server):
    """Four sessions each run a query until the sandbox's 2 s budget stops it (eight step threads
    could all be taken that way) while a fifth steps: its steps wait a small bound, not seconds."""
    heavy = MAX_SESSIONS - 2

    async def both():
        clients = [await open_session(server, CASES[i].case_id) for i in range(heavy + 1)]
        try:
            started = time.perf_counter()
            slow = [asyncio.create_task(c.call("run_sql", query=SLOW_SQL)) for c in clients[:heavy]]
            await asyncio.sleep(0.3)  # every slow query is running
            waits = []
            while not all(t.done() for t in slow) and len(waits) < 200:
                t = time.perf_counter()
                await clients[-1].call("list_batches")
                waits.append(time.perf_counter() - t)
            results = [json.loads((await t).observation.result) for t in slow]
            return waits, results, time.perf_counter() - started
        finally:
            for c in clients:
                await c.close()

    waits, results, wall = run(both())
    assert results == [{"error": "interrupted"}] * heavy and wall >= 1.9  # they did run to their budget
    assert len(waits) >= 10 and max(waits) < 0.25, (len(waits), max(waits))


def test_a_query_answers_beside_budget_long_queries_what_it_answers_alone(server):
    """Its wait for its turn on the baton does not count against its budget: a query of about half a second
    alone came back `interrupted` beside sessions running budget-long queries (found by an outside review)."""
    heavy = MAX_SESSIONS - 1
    medium = SLOW_SQL.replace("FROM c)", "FROM c WHERE x < 20000)")

    async def both():
        clients = [await open_session(server, CASES[i].case_id) for i in range(heavy + 1)]
        try:
            alone = json.loads((await clients[-1].call("run_sql", query=medium)).observation.result)
            slow = [asyncio.create_task(c.call("run_sql", query=SLOW_SQL)) for c in clients[:heavy]]
            await asyncio.sleep(0.3)  # every slow query is running
            t = time.perf_counter()
            beside = json.loads((await clients[-1].call("run_sql", query=medium)).observation.result)
            took = time.perf_counter() - t
            return alone, beside, took, [json.loads((await t).observation.result) for t in slow]
        finally:
            for c in clients:
                await c.close()

    alone, beside, took, results = run(both())
    assert alone["rows"] == [[0]] and beside == alone, (alone, beside, took)
    assert results == [{"error": "interrupted"}] * heavy  # they ran to their budget


def test_the_seed_picks_the_case_the_gymnasium_env_picks(server):
    from gate_pipeline.integrations.gymnasium_env import GateEnv
    gym = GateEnv(CASES)
    with GateEnvClient(base_url=server).sync() as env:
        for seed in (0, 1, 7, 123, 2**40):
            env.reset(seed=seed)
            assert env.state().case_id == gym.reset(seed=seed)[1]["case_id"]
        env.reset(seed=5)  # then resets without a seed go on drawing from the seeded generator
        drawn = []
        for _ in range(3):
            env.reset()
            drawn.append(env.state().case_id)
        gym.reset(seed=5)
        assert drawn == [gym.reset()[1]["case_id"] for _ in range(3)]


# -- what the policy sees, the end of an episode -----------------------------------------------

def test_a_malformed_action_is_an_error_observation_and_the_episode_goes_on(server):
    case = CASES[3]
    with GateEnvClient(base_url=server).sync() as env:
        env.reset(case_id=case.case_id, reward="dense")
        for bad in ("not json", '{"tool": "no_such_tool"}', 5, ["run_sql", "{bad"], {"tool": "run_sql", "x": 1},
                    '{"tool": "run_sql", "args": {"query": "DELETE FROM wh_orders"}}'):
            result = env.step(GateAction(action=bad))
            assert "error" in json.loads(result.observation.result), bad
            assert not result.done
        listing = json.loads(env.call("list_batches").observation.result)
        assert {b["batch_id"] for b in listing} == set(prepare(case).batches)
        assert env.state().step_count == 7


def test_the_observation_carries_no_label_information_and_the_reset_the_tool_catalogue(server):
    from gate_pipeline.model_agent.tool_schemas import tool_schemas
    with GateEnvClient(base_url=server).sync() as env:
        result = env.reset(case_id="eval-amount-bounds-0", reward="dense")
        step = env.call("list_batches")
        state = env.state()
    for obs in (result.observation, step.observation):
        fields = set(obs.model_dump(exclude={"reward", "done", "metadata"}))
        assert fields == {"prompt", "result", "turn", "tools"}
        assert "amount-bounds" not in obs.model_dump_json() and "truth" not in obs.result
    # the tools, their argument schemas and descriptions: the very ones `gate run` sends a model
    assert result.observation.tools == tool_schemas(prepare(BY_ID["eval-amount-bounds-0"]).suite)
    assert [t["function"]["name"] for t in result.observation.tools][:2] == ["read_contract", "list_batches"]
    assert step.observation.tools == []  # only the reset carries them
    assert state.case_id == "eval-amount-bounds-0" and state.step_parts is not None  # the trainer's view


def test_max_turns_truncates_and_steps_after_the_end_are_errors(server):
    with GateEnvClient(base_url=server).sync() as env:
        env.reset(case_id=CASES[0].case_id, max_turns=2)
        assert not env.call("list_batches").done
        last = env.call("read_contract")
        state = env.state()
        assert last.done and state.truncated and not state.terminated
        assert state.grade["reward"] == 0.0 and last.reward == 0.0
        after = env.call("list_batches")
        assert after.done and "error" in json.loads(after.observation.result)


def test_a_step_before_any_reset_is_an_error_observation(server):
    with GateEnvClient(base_url=server).sync() as env:
        result = env.call("list_batches")
    assert "reset first" in json.loads(result.observation.result)["error"] and not result.done


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, words", [
    ({"bogus": 1}, "unknown reset option 'bogus'"),
    ({"reward": "sparse"}, "'reward' must be one of terminal, dense, potential"),
    ({"case_id": "no-such-case"}, "no case 'no-such-case'"),
    ({"case_id": 7}, "no case 7"),
    ({"seed": -1}, "'seed' must be a whole number"),
    ({"seed": "7"}, "'seed' must be a whole number"),
    ({"seed": True}, "'seed' must be a whole number"),
    ({"seed": 7.0}, "'seed' must be a whole number"),
    ({"max_turns": 0}, "'max_turns' must be a whole number from 1 to 1024"),
    ({"max_turns": True}, "'max_turns' must be a whole number"),
    ({"episode_id": ""}, "'episode_id' must be text"),
])
def test_a_bad_reset_is_a_clear_error_and_leaves_the_episode_alone(server, options, words):
    with GateEnvClient(base_url=server).sync() as env:
        env.reset(case_id=CASES[2].case_id)
        env.call("list_batches")
        with pytest.raises(RuntimeError, match=words.replace("(", r"\(")):
            env.reset(**options)
        state = env.state()
    assert state.case_id == CASES[2].case_id and state.step_count == 1


def http(url, path, body=None):
    request = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"content-type": "application/json"}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_http_endpoints(server):
    assert http(server, "/health") == (200, {"status": "healthy"})
    status, body = http(server, "/reset", {"case_id": CASES[0].case_id})
    assert status == 200 and body["observation"]["prompt"] == CASES[0].prompt and body["done"] is False
    assert [t["function"]["name"] for t in body["observation"]["tools"]][0] == "read_contract"
    assert http(server, "/reset", {"reward": "sparse"})[0] == 422
    for bad, words in (({"bogus": 1}, "unknown reset option 'bogus'"), ({"seed": "7"}, "'seed' must be a whole number"),
                       ({"seed": True}, "'seed' must be a whole number"), ([1, 2], "must be a JSON object"),
                       ({"max_turns": "64"}, "'max_turns' must be a whole number")):
        status, body = http(server, "/reset", bad)
        assert status == 422 and words in body["detail"], (bad, body)
    status, body = http(server, "/step", {"action": {"action": '{"tool": "list_batches"}'}})
    assert status == 200 and "reset first" in json.loads(body["observation"]["result"])["error"]
    status, body = http(server, "/step", {"action": {"tool": "list_batches"}})  # a bare tool call
    assert status == 200 and "reset first" in json.loads(body["observation"]["result"])["error"]
    for bad, words in (({"action": "list_batches"}, "'action' must be a JSON object"), ({}, "needs 'action'"),
                       ({"action": {}, "timeout_s": "5"}, "'timeout_s' must be a finite number"),
                       ({"action": {}, "timeout_s": True}, "'timeout_s' must be a finite number"),
                       ({"action": {}, "timeout_s": float("inf")}, "Infinity is not a JSON number"),
                       ({"action": {}, "extra": 1}, "unexpected field 'extra'")):
        status, body = http(server, "/step", bad)
        assert status == 422 and words in body["detail"], (bad, body)
    overflow = urllib.request.Request(server + "/step", data=b'{"action": {}, "timeout_s": 1e999}', method="POST",
                                      headers={"content-type": "application/json"})  # a float that overflows to inf
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(overflow, timeout=10)
    assert refused.value.code == 422 and "must be a finite number above 0, not inf" in json.loads(refused.value.read())["detail"]
    for path, body, key in (("/reset", b'{"case_id": "a", "case_id": "b"}', "case_id"),  # a key twice: refused
                            ("/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "method": "x"}', "method")):
        twice = urllib.request.Request(server + path, data=body, method="POST", headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(twice, timeout=10) as response:
                status, answer = response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            status, answer = exc.code, json.loads(exc.read())
        words = answer.get("detail") or answer["error"]["message"]
        assert status in (200, 422) and f"names the key '{key}' twice" in words, answer
    big = {"case_id": "x" * (2 << 20)}  # over the 1 MiB a body may have: refused, not read to its end
    status, body = http(server, "/reset", big)
    assert status == 422 and "over 1,048,576 bytes" in body["detail"]
    status, body = http(server, "/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": "x" * (2 << 20)})
    assert status == 200 and body["error"]["code"] == -32700 and "over 1,048,576 bytes" in body["error"]["message"]
    status, schema = http(server, "/schema")
    assert status == 200 and [s["title"] for s in schema["action"]["anyOf"]] == [
        "ToolCall", "ChatCompletionsToolCall", "WrappedAction"]
    assert "tools" in schema["observation"]["properties"] and "grade" in schema["state"]["properties"]
    assert http(server, "/metadata")[1]["name"] == "gate"
    status, state = http(server, "/state")
    assert status == 200 and state["step_count"] == 0 and state["trainer"] is False


def test_frames_that_are_not_valid_messages_are_error_frames_and_the_session_lives_on(server):
    ws_url = server.replace("http://", "ws://") + "/ws"

    async def send(*messages):
        answers = []
        async with connect(ws_url, max_size=None) as ws:
            for message in messages:
                await (ws.send(message) if isinstance(message, (str, bytes)) else ws.send(json.dumps(message)))
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        return answers

    reset = {"type": "reset", "data": {"case_id": CASES[0].case_id}}
    frames = [  # (frame, the answer's type, its code)
        (reset, "observation", None),
        ("{not json", "error", "INVALID_JSON"),
        ("[1, 2]", "error", "VALIDATION_ERROR"),                          # JSON, not an object
        ("5", "error", "VALIDATION_ERROR"),
        ('"step"', "error", "VALIDATION_ERROR"),
        ("null", "error", "VALIDATION_ERROR"),
        ("[" * 100_000 + "]" * 100_000, "error", "INVALID_JSON"),          # nested too deep to read
        ("1" * 5000, "error", "INVALID_JSON"),                             # a number too long to read
        (b"\xff\xfe", "error", "INVALID_JSON"),                          # binary, not UTF-8
        ('{"type": "step", "data": {"tool": "list_batches"}, "x": NaN}', "error", "INVALID_JSON"),  # not JSON's
        ('{"type": "reset", "data": {"seed": -Infinity}}', "error", "INVALID_JSON"),
        ('{"type": "state", "type": "reset", "data": {}}', "error", "INVALID_JSON"),  # a key twice: read two ways
        ('{"type": "step", "data": {"tool": "list_batches", "tool": "submit_report"}}', "error", "INVALID_JSON"),
        ({"type": "nope"}, "error", "UNKNOWN_TYPE"),
        ({"data": {}}, "error", "UNKNOWN_TYPE"),
        ({"type": 5}, "error", "UNKNOWN_TYPE"),
        ({"type": "step"}, "error", "VALIDATION_ERROR"),                   # no data
        ({"type": "step", "data": [1]}, "error", "VALIDATION_ERROR"),
        ({"type": "step", "data": "list_batches"}, "error", "VALIDATION_ERROR"),
        ({"type": "step", "data": {"action": 1}, "x": 1}, "error", "VALIDATION_ERROR"),
        ({"type": "step", "data": {"action": {}, "metadata": 5}}, "error", "VALIDATION_ERROR"),
        ({"type": "state", "data": {}}, "error", "VALIDATION_ERROR"),
        ({"type": "reset", "data": [1]}, "error", "VALIDATION_ERROR"),
        ({"type": "reset", "data": {"seed": "7"}}, "error", "VALIDATION_ERROR"),
        ({"type": "reset", "data": {"seed": True}}, "error", "VALIDATION_ERROR"),
        ({"type": "reset", "data": {"self": 1}}, "error", "VALIDATION_ERROR"),
        # well-formed messages whose tool calls are malformed: ordinary steps with an error result
        ({"type": "step", "data": {}}, "observation", None),
        ({"type": "step", "data": {"action": "[" * 100_000}}, "observation", None),
        ({"type": "step", "data": {"tool": "run_sql", "args": {"query": "x" * 500_000}}}, "observation", None),
        ({"type": "step", "data": {"name": "list_batches", "arguments": "{"}}, "observation", None),
        ({"type": "state"}, "state", None),
    ]
    answers = run(send(*[f for f, _, _ in frames]))
    for (sent, kind, code), answer in zip(frames, answers):
        assert answer["type"] == kind and answer["data"].get("code") == code, (str(sent)[:80], answer)
        if kind == "observation" and sent is not reset:
            assert "error" in json.loads(answer["data"]["observation"]["result"]), str(sent)[:80]
    assert answers[-1]["data"]["step_count"] == 4 and answers[-1]["data"]["case_id"] == CASES[0].case_id

    async def too_big():
        async with connect(ws_url) as ws:
            # the server closes a connection that sends over 1 MiB: while the frame is still being written (the
            # send fails) or after it (the next receive does)
            with pytest.raises(ConnectionClosed) as closed:
                await ws.send(json.dumps({"type": "step", "data": {"action": "x" * (2 << 20)}}))
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # "message too big"

    async def too_big_in_pieces():
        # 3 MiB sent as fragments of 4 KiB, each within the limit: the server fails the connection at 1 MiB while
        # the client still sends; closed at once, the socket was reset with bytes unread and the reset lost the
        # close frame
        async def pieces():
            for _ in range(768):
                yield "x" * (1 << 12)
        for _ in range(3):
            async with connect(ws_url) as ws:
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.send(pieces())
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    run(too_big())
    run(too_big_in_pieces())
    assert http(server, "/health") == (200, {"status": "healthy"})


def test_bare_and_chat_completions_tool_calls_play_an_episode_as_the_wrapped_ones(server):
    case = BY_ID["eval-resent-rows-0"]
    actions, grade = careful_sql(case)

    def spellings(action, i):
        name, args = action["tool"], action["args"]
        return [{"tool": name, "args": args},                                             # bare
                {"type": "function", "id": f"call_{i}", "function": {"name": name, "arguments": json.dumps(args)}},
                {"name": name, "arguments": json.dumps(args)},                            # its function
                {"action": json.dumps(action)}][i % 4]                                    # wrapped

    async def play():
        async with connect(server.replace("http://", "ws://") + "/ws") as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"case_id": case.case_id}}))
            await ws.recv()
            for i, action in enumerate(actions):
                await ws.send(json.dumps({"type": "step", "data": spellings(action, i)}))
                answer = json.loads(await ws.recv())
                assert "error" not in json.loads(answer["data"]["observation"]["result"]), answer
            await ws.send(json.dumps({"type": "state"}))
            return json.loads(await ws.recv())["data"]

    state = run(play())
    assert state["terminated"] and state["grade"] == grade


# -- the command line ----------------------------------------------------------------------------

def gate_serve(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "gate_pipeline.cli.main", "serve", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_a_busy_port_and_bad_flags_are_one_line_errors(server):
    port = server.rsplit(":", 1)[1]
    for args, words in ((("--port", port), "cannot listen on 127.0.0.1:" + port),
                        (("--port", "70000"), "--port must be from 0 to 65,535"),
                        (("--max-sessions", "0"), "--max-sessions must be at least 1"),
                        (("--cases", "no/such/file.jsonl"), "no such case file"),
                        (("--host", "no-such-host.invalid"), "--host no-such-host.invalid: cannot resolve it")):
        out = gate_serve(*args)
        assert out.returncode == 2 and out.stdout == "", (args, out.stdout, out.stderr)
        assert out.stderr.startswith("gate: error: ") and words in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_a_ctrl_c_just_after_the_server_says_it_listens_stops_it():
    """A signal that came after the server's check for one and before uvicorn took the handlers over was
    recorded and ignored: the server served on (8 of 10 first Ctrl-Cs just after the ready line, in review).
    Here each signal is sent from a thread 0 to 8 ms after the ready line, twelve times: each stops it."""
    code = f"""
import os, signal, sys, threading, time
from gate_pipeline.integrations.openenv_server import serve
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.pool import CasePool
pool = CasePool(read_cases({str(EVAL)!r})[:2])
for delay in [0.0, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.0, 0.001, 0.002]:
    def ready(url, delay=delay):
        threading.Thread(target=lambda: (time.sleep(delay), os.kill(os.getpid(), signal.SIGINT))).start()
    t = time.monotonic()
    print(serve(pool, port=0, ready=ready), round(time.monotonic() - t, 1), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 12 and all(line.split()[0] == "SIGINT" and float(line.split()[1]) < 5 for line in lines), lines


def test_ctrl_c_stops_the_server_cleanly_with_the_train_split_by_default():
    proc, url, err = start_server()
    try:
        assert http(url, "/health")[0] == 200
        first = read_cases(TRAIN)[0]
        status, body = http(url, "/reset", {"case_id": first.case_id})
        assert status == 200 and body["observation"]["prompt"] == first.prompt  # the train split by default
    finally:
        code = stop_server(proc, signal.SIGINT)
    time.sleep(0.2)
    assert code == 0 and "stopped (SIGINT)" in "".join(err) and "Traceback" not in "".join(err)
    with pytest.raises(OSError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()


def test_suite_v2_cases_are_served_and_grade_as_in_process():
    """`gate serve --cases cases/v2/eval_curated.jsonl`: a v2 episode over the wire (v2's ten tools,
    rows held back, citations) grades as the engine grades it."""
    v2 = EVAL.parent.parent / "v2" / "eval_curated.jsonl"
    cases = read_cases(v2)[:32:4]  # one case of each family (variant 0, first copy)
    proc, url, err = start_server("--cases", str(v2), "--trainer-state")
    try:
        with GateEnvClient(base_url=url).sync() as env:
            for case in cases:
                for name in ("careful-v2", "oracle", "naive"):
                    env.reset(case_id=case.case_id, max_turns=1024)
                    agent = make_agent(name)
                    agent.play(WireTools(env, case), case.data if agent.oracle else None)
                    assert env.state().grade == engine.play(prepare(case), name).grade.as_dict(), (case.case_id, name)
    finally:
        assert stop_server(proc) == 0, "".join(err)[-2000:]


def test_a_session_closed_while_its_step_runs_answers_the_step():
    """openenv/session/close (or the reaper) ends a session while a tools/call on it still runs: the step read
    the session again after playing and found none (AttributeError, an HTTP 500). It answers from the session
    it played, and the close abandons the episode after it."""
    import threading

    from gate_pipeline.integrations.openenv_server import GateServerEnv
    from gate_pipeline.kernel.pool import CasePool
    env = GateServerEnv(CasePool(read_cases(EVAL)[:1]))
    env.reset()
    session = env.session
    answers: list = []
    stepping = threading.Thread(target=lambda: answers.append(env.step({"tool": "run_sql", "args": {"query": SLOW_SQL}})))
    stepping.start()
    time.sleep(0.5)
    env.close()  # while the query runs
    stepping.join(30)
    assert len(answers) == 1 and json.loads(answers[0].result) == {"error": "interrupted"} and answers[0].turn == 1
    assert env.session is None and session is not None and session.done  # abandoned once the step was over


def test_an_answer_that_echoes_a_lone_surrogate_is_json_not_an_error(server):
    """A JSON-RPC id and an initialize's protocol version are echoed; a lone surrogate in them (valid JSON: a
    \\ud800 escape) could not be written as UTF-8, and the request failed with an HTTP 500."""
    status, body = http(server, "/mcp", {"jsonrpc": "2.0", "method": "ping", "id": "\ud800"})
    assert status == 200 and body == {"jsonrpc": "2.0", "result": {}, "id": "\ud800"}
    status, body = http(server, "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                         "params": {"protocolVersion": "\udfff"}})
    assert status == 200 and body["result"]["protocolVersion"] == "\udfff"
    status, body = http(server, "/mcp", {"jsonrpc": "2.0", "method": "nope", "id": "\udfff"})
    assert status == 200 and body["error"]["code"] == -32601 and body["id"] == "\udfff"
    status, body = http(server, "/reset", {"case_id": "\ud800"})
    assert status == 422 and "no case '\\ud800'" in body["detail"]
