"""gate as a gymnasium environment: one episode per reset, one tool call per step.

    import gymnasium
    env = gymnasium.make("gate_pipeline:gate/Gate-v0")          # reward="dense" for the step reward
    obs, info = env.reset(seed=7)                                 # or options={"case_id": "train-007"}
    # suite=NAME: that suite's train split; cases=FILE: any case file
    obs, reward, terminated, truncated, info = env.step('{"tool": "list_batches"}')

A thin adapter over the engine's `Session` (step-driven, ending at the first accepted report
or after `max_turns` steps). Observations are text, as a language-model policy reads them:
`{"prompt": the case's prompt, "result": the tool's result as JSON, "turn": n}`. Actions are
JSON text (`{"tool": name, "args": {...}}`); a dict or a `[name, args]` list is accepted too,
and a malformed action is an error result, never an exception. `reset(seed=...)` seeds the
env's random generator, which picks the case; `options={"case_id": ...}` picks it by id.

`info` carries the case id, the turn, the step reward's layers in dense mode and the grade at
the end: it is for the trainer. Step rewards and `info` carry label information (the dense
reward's Layer 2 is computed from the truth labels); never show them to the policy. Every `info`
value is a number or a string (the tool result, the grade and the tool list as JSON text), so a
vector env (`gymnasium.make_vec`, sync or async) stacks them. Text spaces are bounded
(MAX_TEXT_CHARS, MAX_ACTION_CHARS: async shared memory is allocated at those sizes); a result
longer than the bound comes back as an error naming its length, never cut JSON. `render_mode="ansi"`
renders the last step as text. The registered spec has `max_episode_steps` = DEFAULT_MAX_TURNS, so
gymnasium's TimeLimit and the env truncate on the same step, graded; to change the length pass
`max_turns=N` and `max_episode_steps=N` together (TimeLimit alone cuts an episode the env has not
graded, and the next reset ends it as abandoned).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import read_from_shared_memory

from ..kernel.cases import CaseError, printable
from ..kernel.engine import OVER, Session
from ..kernel.pool import CasePool
from ..kernel.rewards import REWARD_MODES
from ..kernel.settings import Settings
from ..kernel.suite import UnknownSuite, suites
from ..kernel.world import PreparedCase

ENV_ID = "gate/Gate-v0"
DEFAULT_MAX_TURNS = 64
PRINTABLE = "".join(chr(c) for c in range(32, 127))  # JSON text with ensure_ascii stays inside these
MAX_ACTION_CHARS = 20_000
MAX_TEXT_CHARS = 200_000  # the longest prompt or JSON result an observation carries


class ObsText(spaces.Text):
    """gate's Text space. Its one difference: in an async vector env with shared memory its batched values are
    decoded from the shared buffer each time they are read (`LiveTexts`); gymnasium's own reader decodes a Text
    buffer once, when the vector env is built, so every later observation would read as that first one."""


class LiveTexts(Sequence):
    """The batched values of an ObsText space in shared memory, decoded when read; a deep copy (what the
    vector env hands out by default) is a plain tuple of str."""

    def __init__(self, space: spaces.Text, buffer, n: int):
        self._data = np.frombuffer(buffer.get_obj(), dtype=np.int32).reshape((n, space.max_length))
        self._chars = np.array(space.character_list + ("",), dtype="<U1")  # the padding code decodes to ""
        self._pad = len(space.character_set)

    def __len__(self) -> int:
        return self._data.shape[0]

    def _row(self, i: int) -> str:
        row = self._data[i]
        ends = np.flatnonzero(row >= self._pad)
        return "".join(self._chars[np.minimum(row[:ends[0] if ends.size else row.size], self._pad)].tolist())

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self._row(k) for k in range(len(self))[i])
        return self._row(range(len(self))[i])

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, (tuple, list, LiveTexts)) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return f"LiveTexts({tuple(self)!r})"


@read_from_shared_memory.register(ObsText)
def _read_obs_text(space: ObsText, shared_memory, n: int = 1) -> LiveTexts:
    return LiveTexts(space, shared_memory, n)


def _pool(cases, suite: str | None, settings: Settings | None) -> CasePool:
    if cases is None:
        settings = settings or Settings.from_env()  # gymnasium.make is a process entry point
        settings.register_suites()
        return CasePool.default(settings, "train", suite)
    if isinstance(cases, (str, Path)):
        return CasePool.from_file(cases)
    if not isinstance(cases, (list, tuple)) or not cases:
        raise ValueError("cases must be a case file path or a non-empty list of cases")
    return CasePool(cases)


def _text(value) -> str:
    return json.dumps(value, ensure_ascii=True, default=str)


def _action_text(action, limit: int = 2000) -> str:
    """An action as a line of text for render(), whatever it is (nested past JSON's reach, not JSON at all)."""
    if isinstance(action, str):  # as written, its control characters escaped: a newline or an ANSI escape in
        return printable(action[:limit])  # an action cannot forge a line of the render or drive the terminal
    try:
        return _text(action)[:limit]
    except (RecursionError, ValueError, TypeError):
        return f"<a {type(action).__name__} action that is not JSON>"


def _bounded(text: str) -> str:
    """A result's JSON text, or, past MAX_TEXT_CHARS, an error object that says so (valid JSON either way)."""
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return _text({"error": f"the result is {len(text):,} characters of JSON, more than the observation's "
                           f"{MAX_TEXT_CHARS:,}; ask for less (LIMIT, fewer columns)"})


class GateEnv(gymnasium.Env):
    """One gate episode at a time over a list of cases (default: the train split of `suite`, the default
    suite's when none is named)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, cases=None, reward: str = "terminal", max_turns: int = DEFAULT_MAX_TURNS,
                 suite: str | None = None, settings: Settings | None = None, render_mode: str | None = None):
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {list(REWARD_MODES)}, not {reward!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive integer, not {max_turns!r}")
        if suite is not None and suite not in suites.names():
            raise ValueError(f"suite must be one of {suites.names()}, not {suite!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, not {render_mode!r}")
        self.render_mode = render_mode
        self._last: tuple[str, str] = ("", "")  # the last action and result, for render()
        self.reward_mode = reward
        self.max_turns = max_turns
        try:
            self.pool = _pool(cases, suite, settings)
        except (CaseError, UnknownSuite) as exc:
            raise ValueError(str(exc)) from None
        self.cases = self.pool.cases
        self.session: Session | None = None
        self.case_id: str | None = None
        self.observation_space = spaces.Dict({
            "prompt": ObsText(MAX_TEXT_CHARS, min_length=0, charset=PRINTABLE),
            "result": ObsText(MAX_TEXT_CHARS, min_length=0, charset=PRINTABLE),
            "turn": spaces.Discrete(max_turns + 1),
        })
        self.action_space = spaces.Text(MAX_ACTION_CHARS, min_length=1, charset=PRINTABLE)

    def prepared(self, case_id: str) -> PreparedCase:
        """The case's prepared image, built on its first reset and kept."""
        return self.pool.prepared(case_id)

    def _pick(self, options) -> int:
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"options must be a dict or None, not {type(options).__name__}")
        options = options or {}
        unknown = [k for k in options if k != "case_id"]
        if unknown:
            raise ValueError(f"unknown reset option {unknown[0]!r}; options: ['case_id']")
        if "case_id" in options:
            if options["case_id"] not in self.pool:
                raise ValueError(f"no case {options['case_id']!r} among the env's {len(self.cases)} cases")
            return self.pool.index[options["case_id"]]
        return int(self.np_random.integers(len(self.cases)))

    def _obs(self, result_text: str) -> dict:
        prompt = self.pool.case(self.case_id).prompt if self.case_id else ""
        prompt = prompt if prompt.isascii() and prompt.isprintable() else _text(prompt)[1:-1]
        return {"prompt": prompt[:MAX_TEXT_CHARS], "result": result_text,
                "turn": self.session.turn if self.session else 0}

    def reset(self, *, seed=None, options=None):
        """Start an episode on the case `options["case_id"]`, else on one drawn by the seeded generator."""
        super().reset(seed=seed)
        index = self._pick(options)
        self.close()
        self.case_id = self.cases[index].case_id
        self.session = Session(self.prepared(self.case_id), "gymnasium", reward=self.reward_mode,
                               stop_at_report=True, max_steps=self.max_turns)
        self._last = ("reset", "")
        info = {"case_id": self.case_id, "reward_mode": self.reward_mode, "max_turns": self.max_turns,
                "tools": _text({t.name: list(t.arg_names) for t in self.pool.suite.tools})}  # the suite's tools
        return self._obs(""), info

    def step(self, action):
        """One tool call: (observation, reward, terminated, truncated, info). Never raises."""
        if self.session is None or self.session.done:  # nothing to play: the episode's flags as it ended
            over = self.session.step(action) if self.session is not None else None
            why = "call reset() first" if over is None else OVER
            text = _text({"error": why})
            info = {"case_id": self.case_id or "", "reward_mode": self.reward_mode, "error": why, "result": text}
            return (self._obs(text), 0.0, over is not None and over.terminated, over is not None and over.truncated,
                    info)
        step = self.session.step(action)
        text = _bounded(_text(step.result))
        self._last = (action, text)
        info = {"case_id": self.case_id, "turn": self.session.turn, "reward_mode": self.reward_mode,
                "result": text}
        if step.parts is not None:  # the layers, then the step's reward under its own name
            info.update(step.parts)
            info["step_reward"] = info.pop("step")
        if step.grade is not None:
            info["grade"] = _text(step.grade.as_dict())
        return self._obs(text), float(step.reward), step.terminated, step.truncated, info

    def render(self) -> str | None:
        """render_mode "ansi": the case, the turn, the last action and its result, as text."""
        if self.render_mode != "ansi":
            return None
        action, result = self._last
        turn = self.session.turn if self.session else 0
        return f"case {self.case_id or '-'} turn {turn}\n> {_action_text(action)}\n{result[:2000]}\n"

    def close(self) -> None:
        if self.session is not None:
            self.session.close("the environment was reset or closed before the episode ended")
        self.session = None


def register() -> None:
    """Register `gate/Gate-v0` (done on import; `gymnasium.make("gate_pipeline:gate/Gate-v0")`
    imports gate first, so nothing needs importing by hand)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:GateEnv", max_episode_steps=DEFAULT_MAX_TURNS)


register()
