"""The F003 dense step reward: Layer 1 (operational) and Layer 2 (progress to target), clamped.

Why a module of its own: training with GRPO on the end-of-episode rubric alone is slow, so
the episode API (`episode_api.py`) can pay a small signal per inspection step. The rubric is
untouched: it is Layer 3, paid by the caller at `submit_report`. Semantics and test vectors
are in DENSE_REWARD.md. Every layer, sub-score, the bins and the clamp is its own small
function, so a potential-based form (pay the change of progress, clip each step) would only
replace `_layer2_progress` and `_clamp`.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

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
_SPACE = re.compile(r"\s+")


@dataclass
class EpisodeContext:
    """Per-episode reward state, server side, never shown to the agent."""
    gold_rows: list[tuple] = field(default_factory=list)
    query_hashes: set[str] = field(default_factory=set)
    best_progress: float = 0.0
    cumulative_step_reward: float = 0.0
    cumulative_new_info_reward: float = 0.0


def action_key(action_type: str, sql: str) -> str:
    """SHA-256 of a query (trimmed, trailing ';' dropped, inner white space collapsed), or of a
    tool's key text (its name with its arguments as canonical JSON) as given."""
    if action_type == "QUERY":
        text = _SPACE.sub(" ", sql).strip()
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
    room = round(NEW_INFO_CAP - ctx.cumulative_new_info_reward, 9)
    bonus = min(NEW_INFO, room) if room > 0 else 0.0
    ctx.cumulative_new_info_reward += bonus
    return reward + bonus, False


def _cardinality_score(pred_rows: list, gold_rows: list) -> float:
    return 1.0 - abs(len(pred_rows) - len(gold_rows)) / max(len(pred_rows), len(gold_rows), 1)


def _value_overlap_score(pred_rows: list, gold_rows: list) -> float:
    pred = {str(v) for row in pred_rows for v in row}
    gold = {str(v) for row in gold_rows for v in row}
    if not pred and not gold:
        return 1.0
    return len(pred & gold) / len(pred | gold)


def _number(value) -> float | None:
    """The cell as a number when `float()` accepts it (NaN excluded), else None."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(x) else x


def _proximity(distance: float) -> float:
    return 1.0 / (1.0 + math.log1p(distance))


def _numeric_range_score(pred_rows: list, gold_rows: list) -> float:
    gold = [x for row in gold_rows for v in row if (x := _number(v)) is not None]
    if not gold:
        return 1.0
    pred = [x for row in pred_rows for v in row if (x := _number(v)) is not None]
    if not pred:
        return 0.0
    total = 0.0
    for g in gold:
        nearest = min(0.0 if p == g else abs(p - g) for p in pred)
        total += _proximity(nearest)
    return total / len(gold)


def _raw_progress(pred_rows: list, gold_rows: list) -> float:
    wc, wv, wn = PROGRESS_WEIGHTS
    return (wc * _cardinality_score(pred_rows, gold_rows) + wv * _value_overlap_score(pred_rows, gold_rows)
            + wn * _numeric_range_score(pred_rows, gold_rows))


def _bin_progress(raw_score: float) -> float:
    for edge, level in BIN_EDGES:
        if raw_score >= edge:
            return level
    return 0.0


def _layer2_progress(ctx: EpisodeContext, rows: list) -> float:
    """Improvement-only progress towards the gold rows: at most PROGRESS_SCALE per episode."""
    if not ctx.gold_rows:
        return 0.0
    level = _bin_progress(_raw_progress(rows, ctx.gold_rows))
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
        layer2 = _layer2_progress(ctx, [tuple(r) for r in rows])
    return {"layer1": layer1, "layer2": layer2, "step": _clamp(ctx, layer1 + layer2)}


def compute_step_reward(ctx: EpisodeContext, action_type: str, sql: str, rows, error) -> float:
    """The F003 step reward of one DESCRIBE / SAMPLE / QUERY action (ctx is updated)."""
    return step_parts(ctx, action_type, sql, rows, error)["step"]
