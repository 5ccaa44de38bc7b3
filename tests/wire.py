"""Agents over the wire, for the `gate serve` tests: the tools an agent plays through, each call one
step of an OpenEnv client (GateEnvClient, or any OpenEnv client such as GenericEnvClient, sync),
sent as a bare tool call `{"tool": name, "args": {...}}`, as a model writes one; and the same
tools in process, recording each call."""
from __future__ import annotations

import json

from gate_pipeline.kernel import engine
from gate_pipeline.kernel.agents import make_agent
from gate_pipeline.kernel.engine import prepare
from gate_pipeline.kernel.suite import suites


class WireTools:
    """What an agent gets (`tools(name, **args)`, `act`, `episode_seed`, `suite`) over a sync client."""

    def __init__(self, env, case):
        self.env, self.steps = env, []
        self.suite = suites.get(case.suite)
        self.tool_names = self.suite.tool_names
        self.episode_seed = engine.Session(prepare(case), "wire").episode_seed  # fixed by the case

    def __call__(self, name, **args):
        return self.act({"tool": name, "args": args})

    def act(self, action):
        result = self.env.step(action)
        self.steps.append(result)
        obs = result.observation
        return json.loads(obs["result"] if isinstance(obs, dict) else obs.result)


class Recording:
    """What an agent gets in process (an engine Session's tools), keeping each call as an action."""

    def __init__(self, session):
        self.session, self.actions = session, []
        self.episode_seed = session.episode_seed
        self.suite = session.prepared.suite
        self.tool_names = self.suite.tool_names

    def __call__(self, name, **args):
        self.actions.append({"tool": name, "args": json.loads(json.dumps(args))})
        return self.session.call(name, args)


def recorded(case, agent: str = "careful-sql") -> tuple[list, dict]:
    """An agent's calls on a case, played in process, and the grade `engine.play` gives it."""
    session = engine.Session(prepare(case), agent)
    tools = Recording(session)
    make_agent(agent).play(tools)
    grade = session.finish().grade.as_dict()
    assert grade == engine.play(prepare(case), agent).grade.as_dict()
    return tools.actions, grade


def play_over_the_wire(env, case, agent: str, **reset) -> None:
    """`agent` plays `case` through `env` (reset first); the oracles get the case, as in process."""
    env.reset(case_id=case.case_id, **reset)
    player = make_agent(agent)
    player.play(WireTools(env, case), case.data if getattr(player, "oracle", False) else None)
