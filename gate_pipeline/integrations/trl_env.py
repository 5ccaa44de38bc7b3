"""gate for TRL's `GRPOTrainer(environment_factory=...)`: one episode per rollout, the grade as reward.

    from trl import GRPOConfig, GRPOTrainer
    from gate_pipeline.integrations.trl_env import trl_dataset, trl_environment

    factory = trl_environment(cases="cases/classic/train_procedural.jsonl")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=trl_dataset(factory.pool),
                          environment_factory=factory)

TRL builds one instance per rollout (`factory()`), calls `reset(**row)` with the dataset row before
generating, exposes the instance's public methods as tools (their type hints and Google-style
docstrings are the schema the model sees), calls them with the model's arguments, and calls
`get_reward()` once the rollout is over. Here the public methods are the suite's tools, built from
the suite's own catalogue (`Suite.tools`, the same names, arguments and descriptions as
`tool_schemas`); each call is one step of an engine `Session` (the one action parser, the ledger,
the grader), and returns the tool's JSON value as text. The first accepted `submit_report` ends the
episode; later calls are answered with the engine's "episode is over" error, as in the gymnasium
env. `get_reward()` grades the episode (no report, no credit) and returns the rubric's reward.

This module imports nothing of TRL: the class is what TRL drives, and nothing more.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..kernel.engine import Session
from ..kernel.pool import CasePool
from ..kernel.rewards import REWARD_MODES
from ..kernel.settings import Settings
from ..kernel.suite import Suite, Tool
from ..model_agent.prompt import OPENING
from ..model_agent.tool_schemas import as_method

DEFAULT_MAX_STEPS = 64


def _pool(cases, suite: str | None, split: str, settings: Settings | None) -> CasePool:
    if isinstance(cases, CasePool):
        return cases
    if cases is None:
        settings = settings or Settings.from_env()  # an environment factory is a process entry point
        settings.register_suites()
        return CasePool.default(settings, split, suite)
    if isinstance(cases, (str, Path)):
        return CasePool.from_file(cases)
    return CasePool(cases)


class GateTRLEnv:
    """The frame every suite's TRL environment shares: reset, the step, the reward. The tools are
    added per suite by `environment_class` (TRL lists the class's public functions)."""

    pool: CasePool  # set on each suite's class by environment_class
    reward_mode: str = "terminal"
    max_steps: int = DEFAULT_MAX_STEPS

    def __init__(self):
        self.session: Session | None = None
        self.case_id: str | None = None
        self.grade: dict | None = None

    def reset(self, case_id: str | None = None, **row) -> str | None:
        """Start an episode of the case `case_id` (the dataset row's column; TRL passes the whole row).
        Returns None when the row brings its prompt, else the suite's system prompt and opening."""
        if case_id not in self.pool:
            raise ValueError(f"reset needs the case_id of one of the environment's {len(self.pool)} cases, "
                             f"not {str(case_id)[:80]!r}")
        self._close("the environment was reset before the episode ended")
        self.case_id, self.grade = case_id, None
        self.session = Session(self.pool.prepared(case_id), "trl", reward=self.reward_mode, stop_at_report=True,
                               max_steps=self.max_steps)
        return None if row.get("prompt") else f"{self.pool.suite.prompt}\n\n{OPENING}"

    def _step(self, tool: str, args: dict) -> str:
        if self.session is None:
            return json.dumps({"error": "call reset() first"})
        step = self.session.step({"tool": tool, "args": args})
        return json.dumps(step.result, default=str)

    def get_reward(self) -> float:
        """The episode's reward from the one grader (what reached the warehouse, the ledger); an episode
        still open is graded as it stands (no report: no credit). `grade` keeps the whole grade."""
        if self.session is None:
            return 0.0
        result = self.session.finish()
        self.grade = result.grade.as_dict()
        # terminal: the rubric's reward; dense or potential: the episode's return (its step rewards' sum)
        return float(result.grade.reward if self.reward_mode == "terminal" else result.total_reward)

    def _close(self, why: str) -> None:
        if self.session is not None:
            self.session.close(why)
        self.session = None


def _method(tool: Tool, suite: Suite) -> Callable:
    names = tool.arg_names

    def call(self, /, *args, **kwargs) -> str:  # `self` positional-only: an argument a model names "self" is its own
        if len(args) > len(names):
            return json.dumps({"error": f"{tool.name} takes {len(names)} argument(s)"})
        given = dict(zip(names, args))
        clash = sorted(set(given) & set(kwargs))
        if clash:
            return json.dumps({"error": f"{tool.name} got {clash[0]!r} twice"})
        return self._step(tool.name, {**given, **kwargs})  # the engine checks names and kinds

    return as_method(tool, suite, call)


def environment_class(pool: CasePool, reward: str = "terminal", max_steps: int = DEFAULT_MAX_STEPS) -> type:
    """A GateTRLEnv subclass over `pool` with one typed method per tool of the pool's suite."""
    if reward not in REWARD_MODES:
        raise ValueError(f"reward must be one of {list(REWARD_MODES)}, not {reward!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, not {max_steps!r}")
    suite = pool.suite
    clash = [t.name for t in suite.tools if t.name.startswith("_") or hasattr(GateTRLEnv, t.name)]
    if clash:
        raise ValueError(f"the {suite.name} suite's tool {clash[0]!r} cannot be a method of the environment")
    namespace: dict = {tool.name: _method(tool, suite) for tool in suite.tools}
    namespace.update(pool=pool, reward_mode=reward, max_steps=max_steps,
                     __doc__=f"gate's {suite.name} suite for TRL: {', '.join(suite.tool_names)}.")
    return type(f"Gate{suite.name.title().replace('-', '').replace('_', '')}TRLEnv", (GateTRLEnv,), namespace)


def trl_environment(cases=None, suite: str | None = None, split: str = "train", reward: str = "terminal",
                    max_steps: int = DEFAULT_MAX_STEPS, settings: Settings | None = None) -> type:
    """The `environment_factory` for GRPOTrainer: a class (calling it makes one rollout's environment)
    over `cases` (a case file, a list of cases or a CasePool; default: `suite`'s `split` split). Its
    `pool` holds the cases, each prepared once and shared by every instance."""
    return environment_class(_pool(cases, suite, split, settings), reward, max_steps)


def trl_dataset(pool: CasePool):
    """A `datasets.Dataset` with one row per case: `prompt` (the system prompt and the opening, as
    chat messages), `case_id` (what `reset` takes), `family`, `suite`."""
    from datasets import Dataset
    return Dataset.from_list([{"prompt": [{"role": "system", "content": pool.suite.prompt},
                                          {"role": "user", "content": OPENING}],
                               "case_id": c.case_id, "family": c.family, "suite": c.suite} for c in pool])
