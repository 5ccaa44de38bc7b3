"""Reward modes: `terminal` (the rubric alone), `dense` (SQLEnv's F003 step reward, clamped) and
`potential` (potential-based shaping over the episode's state).

Why a module of its own: training with GRPO on the end-of-episode rubric alone is slow, so
the engine can pay a signal per step. The rubric is untouched: the engine pays it at the first
accepted `submit_report`.

- `dense` pays inspection steps (Layer 1, operational, and Layer 2, progress towards the gold
  rows); decisions pay nothing. It can be farmed: distinct cheap queries collect Layer 1, and a
  policy that watches Layer 2 finds the defective batch without reading the contract
  (benchmarks/bench_reward_hacking.py measures both).
- `potential` pays F = Phi(s') - Phi(s) (Ng, Harada & Russell, 1999, with gamma = 1), where Phi
  is the rubric's disposition, evidence and inspected terms on the warehouse and ledger as they
  stand, and Phi is 0 once the episode ends. Every episode's shaping therefore sums to -Phi(s0),
  a constant of the case: the return is the rubric's reward minus that constant, so no policy
  can raise its return by anything but a better grade, and agents rank as under `terminal`.

Step rewards and `info` carry label information (Layer 2 and Phi are computed from the truth
labels): they are for the trainer, never for the policy to see. Semantics and test vectors
are in DENSE_REWARD.md. Every layer, sub-score, the bins and the clamp is its own small
function, so a potential-based form (pay the change of progress, clip each step) would only
replace `_layer2_progress` and `_clamp`.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping

from .actions import preview
from .sandbox import MAX_QUERY_CHARS

STEP_COST = -0.005
REPEAT_PENALTY = -0.01
EXEC_OK = 0.02
NEW_INFO = 0.01
NEW_INFO_CAP = 0.10
PROGRESS_SCALE = 0.15
PROGRESS_WEIGHTS = (0.25, 0.50, 0.25)  # cardinality, value overlap, numeric range
BIN_EDGES = ((0.875, 1.0), (0.625, 0.75), (0.375, 0.5), (0.125, 0.25))
CLAMP = (-0.2, 0.5)
ACTION_TYPES = ("DESCRIBE", "SAMPLE", "QUERY")


@dataclass
class EpisodeContext:
    """Per-episode reward state, server side, never shown to the agent."""
    gold_rows: list[tuple] = field(default_factory=list)
    query_hashes: set[str] = field(default_factory=set)
    best_progress: float = 0.0
    cumulative_step_reward: float = 0.0
    cumulative_new_info_reward: float = 0.0
    _gold: "_Gold | None" = field(default=None, repr=False, compare=False)  # gold's cells, cached


def action_key(action_type: str, sql: str) -> str:
    """SHA-256 of a query (trimmed, trailing ';' dropped, inner white space collapsed), or of a
    tool's key text (its name with its arguments as canonical JSON) as given."""
    if action_type == "QUERY":
        text = sql
        # already normal when no white space but single inner spaces (every other white space
        # character is non-printable); else trim and collapse runs of white space
        if not (sql.isprintable() and "  " not in sql and sql[:1] != " " and sql[-1:] != " "):
            text = " ".join(sql.split())
        while text.endswith(";"):
            text = text[:-1].rstrip()
    else:
        text = sql
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _layer1_operational(ctx: EpisodeContext, action_type: str, sql: str, rows, error) -> tuple[float, bool]:
    """(Layer 1 reward, whether the action repeated an earlier one). Step cost first."""
    reward = STEP_COST
    key = action_key(action_type, sql)
    repeat = key in ctx.query_hashes
    ctx.query_hashes.add(key)
    if repeat:
        return reward + REPEAT_PENALTY, True
    if error is not None:
        return reward, False
    reward += EXEC_OK
    room = NEW_INFO_CAP - ctx.cumulative_new_info_reward
    if room <= 1e-9:  # ten payments of 0.01 sum to 0.0999..., which is the cap reached
        return reward, False
    bonus = min(NEW_INFO, room)
    ctx.cumulative_new_info_reward += bonus
    return reward + bonus, False


def _cardinality_score(pred_rows: list, gold_rows: list) -> float:
    return 1.0 - abs(len(pred_rows) - len(gold_rows)) / max(len(pred_rows), len(gold_rows), 1)


def _cells(rows) -> set[str]:
    return {str(v) for row in rows for v in row}


def _jaccard(pred: set, gold: set) -> float:
    if not pred and not gold:
        return 1.0
    return len(pred & gold) / len(pred | gold)


def _value_overlap_score(pred_rows: list, gold_rows: list) -> float:
    return _jaccard(_cells(pred_rows), _cells(gold_rows))


@lru_cache(maxsize=1 << 16)
def _text_number(text: str) -> float | None:
    """What `float()` makes of a cell's text (NaN excluded); cached, as cells recur across queries."""
    try:
        x = float(text)
    except (ValueError, OverflowError):
        return None
    return None if math.isnan(x) else x


def _number(value) -> float | None:
    """The cell as a number when `float()` accepts it (NaN excluded), else None."""
    kind = type(value)
    if kind is str:
        return _text_number(value)
    if kind is float:
        return None if value != value else value
    if kind is int:
        return float(value)
    if value is None or kind is bool:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(x) else x


def _numbers(rows) -> list[float]:
    return [x for row in rows for v in row
            if (x := (_text_number(v) if type(v) is str else _number(v))) is not None]


def _proximity(distance: float) -> float:
    return 1.0 / (1.0 + math.log1p(distance))


def _proximity_mean(pred: list[float], gold: list[float]) -> float:
    if not gold:
        return 1.0
    if not pred:
        return 0.0
    total = 0.0
    for g in gold:
        total += _proximity(min(0.0 if p == g else abs(p - g) for p in pred))
    return total / len(gold)


def _numeric_range_score(pred_rows: list, gold_rows: list) -> float:
    gold = _numbers(gold_rows)
    return _proximity_mean(_numbers(pred_rows), gold) if gold else 1.0


def _raw_progress(pred_rows: list, gold_rows: list) -> float:
    wc, wv, wn = PROGRESS_WEIGHTS
    return (wc * _cardinality_score(pred_rows, gold_rows) + wv * _value_overlap_score(pred_rows, gold_rows)
            + wn * _numeric_range_score(pred_rows, gold_rows))


def _bin_progress(raw_score: float) -> float:
    for edge, level in BIN_EDGES:
        if raw_score >= edge:
            return level
    return 0.0


@dataclass(frozen=True)
class _Gold:
    """The gold side of the sub-scores, computed once per episode."""
    rows: list
    cells: set
    numbers: list


def _gold_of(ctx: EpisodeContext) -> _Gold:
    if ctx._gold is None or ctx._gold.rows is not ctx.gold_rows:
        ctx._gold = _Gold(ctx.gold_rows, _cells(ctx.gold_rows), _numbers(ctx.gold_rows))
    return ctx._gold


def _progress_level(ctx: EpisodeContext, rows: list) -> float:
    """`_bin_progress(_raw_progress(rows, gold))`, or 0.0 as soon as the bin cannot beat
    best_progress even with the remaining sub-scores at 1. The sums are the plain formula's, in
    its order, so the bins are the same; numeric range (the costly part) is computed only when
    it can move the bin."""
    gold, best = _gold_of(ctx), ctx.best_progress
    wc, wv, wn = PROGRESS_WEIGHTS
    if not rows:  # nothing returned: cardinality and overlap 0, numeric range 0 (or 1 without numbers)
        return _bin_progress(0.0 if gold.numbers else wn)
    raw = wc * _cardinality_score(rows, gold.rows)
    if _bin_progress(raw + wv + wn) <= best:
        return 0.0
    raw += wv * _jaccard(_cells(rows), gold.cells)
    top = _bin_progress(raw + wn)  # the bin with numeric range 1.0 (what it is when gold has no number)
    if top <= best or not gold.numbers or _bin_progress(raw) == top:
        return top if top > best else 0.0
    return _bin_progress(raw + wn * _proximity_mean(_numbers(rows), gold.numbers))


def _layer2_progress(ctx: EpisodeContext, rows: list) -> float:
    """Improvement-only progress towards the gold rows: at most PROGRESS_SCALE per episode."""
    if not ctx.gold_rows or ctx.best_progress >= 1.0:  # nothing left to pay: skip the scoring
        return 0.0
    level = _progress_level(ctx, rows)
    if level <= ctx.best_progress:
        return 0.0
    paid = PROGRESS_SCALE * (level - ctx.best_progress)
    ctx.best_progress = level
    return paid


def _clamp(ctx: EpisodeContext, step: float) -> float:
    """Keep the running Layer 1 + 2 total in CLAMP; return what this step really adds."""
    lo, hi = CLAMP
    before = ctx.cumulative_step_reward
    after = min(hi, max(lo, before + step))
    ctx.cumulative_step_reward = after
    return after - before


def step_parts(ctx: EpisodeContext, action_type: str, sql: str, rows, error) -> dict:
    """Each layer's part of one shaped step: {"layer1", "layer2", "step"} (step = clamped sum).

    Layer 2 runs for a successful QUERY that is not a repeat: a repeat never pays.
    """
    if action_type not in ACTION_TYPES:
        raise ValueError(f"action_type must be one of {ACTION_TYPES}, not {action_type!r}")
    layer1, repeat = _layer1_operational(ctx, action_type, sql, rows, error)
    layer2 = 0.0
    if action_type == "QUERY" and error is None and rows is not None and not repeat:
        layer2 = _layer2_progress(ctx, rows)
    return {"layer1": layer1, "layer2": layer2, "step": _clamp(ctx, layer1 + layer2)}


def compute_step_reward(ctx: EpisodeContext, action_type: str, sql: str, rows, error) -> float:
    """The F003 step reward of one DESCRIBE / SAMPLE / QUERY action (ctx is updated)."""
    return step_parts(ctx, action_type, sql, rows, error)["step"]


# -- reward modes ------------------------------------------------------------------------------

REWARD_MODES = ("terminal", "dense", "potential")
POTENTIAL_TERMS = ("disposition", "evidence", "inspected")


# json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False) with its encoder built once (json.dumps
# builds one per call when given options): the same text
_key_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def call_key(tool, args) -> str:
    """A tool's repeat key text: its name with its arguments as canonical JSON (anything an agent
    made up, a bounded preview of it, so the key costs the same whatever was sent)."""
    if type(args) is dict and not args:  # (not `args == {}`: an array an agent sent compares element by element)
        return f"{tool}{{}}"
    if not (isinstance(args, dict) and all(isinstance(k, str) and isinstance(v, str) and len(v) <= 1000
                                           for k, v in args.items())):
        args = preview(args)
    text = _key_json(args)
    return (tool if isinstance(tool, str) and len(tool) <= 200 else json.dumps(preview(tool))) + text


def shaped_parts(ctx: EpisodeContext, tool, args, result, shaped: Mapping[str, str | None]) -> dict | None:
    """Layers 1-2 of one call, or None for a call that is not shaped (a decision, the report).

    `shaped` maps each of the episode's tools to its F003 action type (DESCRIBE, SAMPLE, QUERY), or to
    None for a decision: a per-decision reward would leak the label inside the episode. A call to a
    tool gate does not have (or a malformed action) is shaped as a refused DESCRIBE (step cost,
    repeats penalised), so wasted turns are never free.
    """
    action_type = shaped.get(tool, "DESCRIBE") if isinstance(tool, str) else "DESCRIBE"
    if action_type is None:
        return None
    error = result["error"] if type(result) is dict and "error" in result and len(result) == 1 else None
    if (action_type == "QUERY" and isinstance(args, dict) and isinstance(query := args.get("query"), str)
            and len(query) <= MAX_QUERY_CHARS):
        return step_parts(ctx, "QUERY", query, None if error is not None else result["rows"], error)
    return step_parts(ctx, action_type, call_key(tool, args), None, error)


class DenseShaper:
    """The dense mode's per-episode state: `shape(tool, args, result)` gives the call's parts."""

    def __init__(self, gold_rows: list[tuple], shaped: Mapping[str, str | None]):
        self.ctx = EpisodeContext(gold_rows=list(gold_rows))
        self.shaped = shaped

    def shape(self, tool, args, result) -> dict | None:
        return shaped_parts(self.ctx, tool, args, result, self.shaped)

    def close(self) -> float:
        return 0.0


class PotentialShaper:
    """Potential-based shaping over one live episode: every call pays Phi(after) - Phi(before), Phi being
    the suite's rubric on the ledger as it stands (`Rubric.potential`), folded one entry at a time."""

    def __init__(self, episode):
        self.episode = episode
        self.case = episode.prepared.case
        self.rubric = episode.prepared.suite.rubric
        self.state = self.rubric.fold(self.case)
        self.seen = 0
        self.phi = self.potential()
        self.start = self.phi

    def potential(self) -> float:
        entries = self.episode.ledger.entries
        for entry in entries[self.seen:]:
            self.state.apply(entry)
        self.seen = len(entries)
        return self.rubric.potential(self.case, self.state)

    def shape(self, tool, args, result) -> dict:
        before, self.phi = self.phi, self.potential()
        return {"potential": self.phi, "step": self.phi - before}

    def close(self) -> float:
        """An episode that ends without a report: Phi falls to 0 with it (so shaping still sums to -Phi(s0))."""
        last, self.phi = self.phi, 0.0
        return -last


def make_shaper(mode: str, prepared, episode=None):
    """The step shaper of a reward mode for one episode of `prepared` (None: terminal)."""
    if mode == "terminal":
        return None
    if mode == "dense":
        return DenseShaper(prepared.gold_rows, {t.name: t.shaped for t in prepared.suite.tools})
    if mode == "potential":
        return PotentialShaper(episode)
    raise ValueError(f"reward must be one of {list(REWARD_MODES)}, not {mode!r}")
