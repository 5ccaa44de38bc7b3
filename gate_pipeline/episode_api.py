"""An episode API for RL training: reset / step with gymnasium's signatures, no Dagster.

Why a module of its own: training code drives episodes directly, one tool call per step, and
wants either the rubric alone (`reward="terminal"`, the default: the only non-zero reward is
the core grade at `submit_report`) or the F003 dense signal (`reward="dense"`: Layers 1-2 per
inspection step from `rewards.py`, the rubric as Layer 3 at the report). Tools, ledger and
rubric are the core's (`tools.Episode`, `grader.grade`), unchanged. `replay_dense` gives the
same rewards for recorded calls (`gate replay --reward dense`). When gymnasium is installed,
`GateEnv` is a `gymnasium.Env` and is registered as `gate/Gate-v0`.

Actions: {"tool": name, "args": {...}} or a (name, args) tuple. Observations: reset gives
{"prompt", "tools", "result": None, "turn": 0}; step gives {"result": <the tool's JSON value>,
"turn": n}. A malformed action is an error result (logged in the ledger like any refused
call); `step` never raises.
"""
from __future__ import annotations

import json
from pathlib import Path

from .cases import read_cases, validate_case
from .contract import PROJECT_ROOT
from .gold import gold_rows
from .grader import grade
from .rewards import EpisodeContext, step_parts
from .runner import replay
from .tools import SIGNATURES, TOOL_NAMES, Episode
from .world import PreparedCase

try:  # gymnasium is optional (the `gym` extra)
    import gymnasium
except ImportError:  # pragma: no cover - depends on the install
    gymnasium = None

DEFAULT_CASES = PROJECT_ROOT / "cases" / "classic" / "train_procedural.jsonl"
REWARD_MODES = ("terminal", "dense")
DEFAULT_MAX_TURNS = 64
ENV_ID = "gate/Gate-v0"
# gate tool -> F003 action type; every other gate tool (decisions, the report) is not shaped
SHAPED = {"read_contract": "DESCRIBE", "list_batches": "DESCRIBE", "profile_batch": "SAMPLE", "run_sql": "QUERY"}
UNSHAPED = frozenset(TOOL_NAMES) - set(SHAPED)
NOT_SHAPED = {"layer1": 0.0, "layer2": 0.0, "step": 0.0}
TOOL_LIST = {tool: [[arg, kind] for arg, kind in sig] for tool, sig in SIGNATURES.items()}


def call_key(tool, args) -> str:
    """A tool's repeat key text: its name with its arguments as canonical JSON."""
    if args == {}:
        return f"{tool}{{}}"
    try:
        text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # keys that cannot be sorted or encoded
        text = repr(args)
    return str(tool) + text


def shaped_parts(ctx: EpisodeContext, tool, args, result) -> dict | None:
    """Layers 1-2 of one call, or None for a call that is not shaped (decisions, the report).

    A call to a tool gate does not have is shaped as a refused DESCRIBE (step cost, repeats
    penalised), so wasted turns are never free.
    """
    action_type = SHAPED.get(tool, "DESCRIBE") if isinstance(tool, str) else "DESCRIBE"
    if isinstance(tool, str) and tool in UNSHAPED:
        return None
    error = result["error"] if type(result) is dict and "error" in result and len(result) == 1 else None
    if action_type == "QUERY" and isinstance(args, dict) and isinstance(query := args.get("query"), str):
        return step_parts(ctx, "QUERY", query, None if error is not None else result["rows"], error)
    return step_parts(ctx, action_type, call_key(tool, args), None, error)


def parse_action(action) -> tuple[object, object]:
    """(tool, args) of an action; anything malformed becomes a call the tools refuse."""
    if isinstance(action, dict):
        return action.get("tool"), action.get("args", {})
    if isinstance(action, (tuple, list)) and 1 <= len(action) <= 2:
        return action[0], (action[1] if len(action) == 2 else {})
    return None, action


def _load_cases(cases) -> list[dict]:
    if cases is None:
        return read_cases(DEFAULT_CASES)
    if isinstance(cases, (str, Path)):
        return read_cases(cases)
    if not isinstance(cases, (list, tuple)) or not cases:
        raise ValueError("cases must be a case file path or a non-empty list of cases")
    out = [validate_case(c, f"cases[{i}]") for i, c in enumerate(cases)]
    ids = [c["case_id"] for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError("cases: case ids repeat")
    return out


_Base = gymnasium.Env if gymnasium is not None else object


class GateEnv(_Base):
    """One gate episode at a time: reset picks a case, each step is one tool call."""

    metadata = {"render_modes": []}

    def __init__(self, cases=None, reward: str = "terminal", max_turns: int = DEFAULT_MAX_TURNS):
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, not {reward!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive integer, not {max_turns!r}")
        self.reward_mode = reward
        self.max_turns = max_turns
        self.cases = _load_cases(cases)
        self._index = {c["case_id"]: i for i, c in enumerate(self.cases)}
        self._prepared: dict[str, tuple[PreparedCase, list[tuple]]] = {}
        self._next = 0
        self.episode: Episode | None = None
        self.ctx: EpisodeContext | None = None
        self.turn = 0
        self.done = False
        self.case_id: str | None = None

    # -- reset ----------------------------------------------------------------------------
    def _pick(self, seed, options) -> int:
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"options must be a dict or None, not {type(options).__name__}")
        options = options or {}
        unknown = [k for k in options if k != "case_id"]
        if unknown:
            raise ValueError(f"unknown reset option {unknown[0]!r}; options: ['case_id']")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, not {seed!r}")
        if "case_id" in options:
            if options["case_id"] not in self._index:
                raise ValueError(f"no case {options['case_id']!r} among the env's {len(self.cases)} cases")
            return self._index[options["case_id"]]
        if seed is not None:
            return seed % len(self.cases)
        return self._next

    def case(self, case_id: str) -> dict:
        return self.cases[self._index[case_id]]

    def prepared(self, case_id: str) -> tuple[PreparedCase, list[tuple]]:
        """The case's prepared image and gold rows, built on its first reset and kept."""
        if case_id not in self._prepared:
            case = self.case(case_id)
            self._prepared[case_id] = (PreparedCase(case), gold_rows(case))
        return self._prepared[case_id]

    def reset(self, seed=None, options=None):
        """Start an episode: options {"case_id": id}, else case `seed % n`, else the next case."""
        index = self._pick(seed, options)
        if gymnasium is not None:
            super().reset(seed=seed)
        self.close()
        case = self.cases[index]
        self._next = (index + 1) % len(self.cases)
        self.case_id = case["case_id"]
        prepared, gold = self.prepared(self.case_id)
        self.episode = Episode(prepared)
        self.ctx = EpisodeContext(gold_rows=list(gold)) if self.reward_mode == "dense" else None
        self.turn = 0
        self.done = False
        obs = {"prompt": case["prompt"], "tools": TOOL_LIST, "result": None, "turn": 0}
        return obs, {"case_id": self.case_id, "reward_mode": self.reward_mode, "max_turns": self.max_turns}

    # -- step -----------------------------------------------------------------------------
    def step(self, action):
        """One tool call: (observation, reward, terminated, truncated, info). Never raises."""
        if self.episode is None or self.done:
            why = "call reset() first" if self.episode is None else "the episode is over; call reset()"
            info = {"case_id": self.case_id, "turn": self.turn, "reward_mode": self.reward_mode, "error": why}
            return {"result": {"error": why}, "turn": self.turn}, 0.0, self.done, False, info
        tool, args = parse_action(action)
        world = self.episode.world
        reported_before = world.report is not None
        result = self.episode.call(tool, args)
        self.turn += 1
        info = {"case_id": self.case_id, "turn": self.turn, "reward_mode": self.reward_mode}
        step_reward = 0.0
        if self.ctx is not None:
            parts = shaped_parts(self.ctx, tool, args, result) or NOT_SHAPED
            step_reward = parts["step"]
            info["layer1"], info["layer2"], info["step_reward"] = parts["layer1"], parts["layer2"], step_reward
            info["cumulative_step_reward"] = self.ctx.cumulative_step_reward
        terminated = not reported_before and world.report is not None
        truncated = not terminated and self.turn >= self.max_turns
        terminal = 0.0
        if terminated:
            g = grade(self.episode)
            terminal = g["reward"]
            info["grade"] = g
        info["layer3"] = terminal
        self.done = terminated or truncated
        return {"result": result, "turn": self.turn}, step_reward + terminal, terminated, truncated, info

    def close(self) -> None:
        if self.episode is not None:
            self.episode.close()
            self.episode = None


def run_agent(env: GateEnv, agent, case_id: str, actions: list | None = None) -> dict:
    """One episode of a gate agent in `env` on a case: its return, step part and terminal part apart.

    The agent plays through `tools(name, **args)` as anywhere else; an agent that raises ends
    the episode where it stands (as `runner.play` does), with the error recorded. Each action
    sent is appended to `actions` when a list is given.
    """
    _, info = env.reset(options={"case_id": case_id})
    totals = {"step": 0.0, "terminal": 0.0, "turns": 0, "terminated": False, "truncated": False}

    def tools(name, **args):
        action = {"tool": name, "args": args}
        if actions is not None:
            actions.append(action)
        obs, _, terminated, truncated, step_info = env.step(action)
        if "error" not in step_info:
            totals["step"] += step_info.get("step_reward", 0.0)
            totals["terminal"] += step_info["layer3"]
            totals.update(turns=step_info["turn"], terminated=terminated, truncated=truncated)
        return obs["result"]

    try:
        agent.play(tools, env.case(case_id) if getattr(agent, "oracle", False) else None)
    except Exception as exc:  # an agent's bug must not take the run down
        totals["error"] = f"{type(exc).__name__}: {exc}"
    totals["return"] = totals["step"] + totals["terminal"]
    return totals


def replay_dense(prepared: PreparedCase, calls: list) -> dict:
    """`runner.replay` plus the dense reward of every call and their sum ("dense_return").

    One number per call: the step reward of each shaped call; 0.0 for decisions and for every
    call after the first accepted `submit_report`; at that report, the episode's rubric reward.
    """
    out = replay(prepared, calls)
    ctx = EpisodeContext(gold_rows=gold_rows(prepared.case))
    rewards: list[float] = []
    reported = False
    for call, result in zip(calls, out["results"]):
        tool, args = (call.get("tool"), call.get("args", {})) if isinstance(call, dict) else (None, call)
        if reported:
            rewards.append(0.0)
        elif tool == "submit_report" and result == {"status": "received"}:
            reported = True
            rewards.append(out["grade"]["reward"])
        else:
            parts = shaped_parts(ctx, tool, args, result)
            rewards.append(parts["step"] if parts else 0.0)
    out["rewards"] = rewards
    out["dense_return"] = sum(rewards)
    return out


if gymnasium is not None and ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:GateEnv", disable_env_checker=True)
