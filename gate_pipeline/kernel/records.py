"""The typed records every surface shares: a grade, a played episode, a stored episode.

One engine (`engine.py`) plays every episode and returns an `EpisodeResult` holding its
`Grade`; the run store gives back `StoredEpisode`s that the grader grades again. Tables, JSON
output, the Dagster assets, transcripts and the gymnasium/verifiers adapters all read these
records, so a figure means the same thing wherever it is printed.
"""
from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass, field
from typing import Mapping

from .cases import Case
from .ledger import Ledger

TERMS = ("disposition", "report", "evidence", "inspected")
WEIGHTS = {"disposition": 0.50, "report": 0.20, "evidence": 0.15, "inspected": 0.15}
METRICS = ("bad_batches_loaded", "revenue_error_usd", "ledger_intact", "finished")
# the grade keys the classic suite prints, in its order
GRADE_KEYS = (*TERMS, "reward", *METRICS)

# How an episode ended. Only REPORTED earns credit; the model agent adds MAX_TURNS, TIMEOUT and
# API_ERROR (the last two are the server's fault, so `gate run` plays them again on resume).
REPORTED, NO_REPORT, AGENT_ERROR = "reported", "no_report", "agent_error"
MAX_TURNS, TIMEOUT, API_ERROR = "max_turns", "timeout", "api_error"
ABANDONED = "abandoned"


@dataclass(frozen=True, slots=True, kw_only=True)
class Grade:
    """The rubric's four terms, the reward and the metrics of one episode, from what happened.

    Built by keyword. `metrics` holds the figures a suite's rubric adds (suite v2: the cost of its
    questions, the bad rows loaded, the clean rows lost; `Suite.metrics` names them)."""
    case_id: str
    family: str
    disposition: float
    report: float
    evidence: float
    inspected: float
    reward: float
    bad_batches_loaded: int
    clean_batches_refused: int
    revenue_error_usd: float
    ledger_intact: bool
    finished: bool
    revenue: float
    correct_revenue: float
    failed: bool = False
    reason: str = ""
    suite: str = ""
    metrics: Mapping[str, float | int] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.case_id, self.reward, self.reason))

    def as_dict(self) -> dict:
        """The grade as JSON: the classic's keys first, then revenue and failure, the suite, its metrics."""
        out = {"case_id": self.case_id, "family": self.family, "disposition": self.disposition,
               "report": self.report, "evidence": self.evidence, "inspected": self.inspected,
               "reward": self.reward, "bad_batches_loaded": self.bad_batches_loaded,
               "clean_batches_refused": self.clean_batches_refused, "revenue_error_usd": self.revenue_error_usd,
               "ledger_intact": self.ledger_intact, "finished": self.finished, "revenue": self.revenue,
               "correct_revenue": self.correct_revenue, "failed": self.failed, "reason": self.reason,
               "suite": self.suite}
        out.update(self.metrics)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Grade":
        """A grade from its JSON (`as_dict`); keys that are not fields are the suite's metrics."""
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data and name != "metrics"}
        metrics = {k: v for k, v in data.items() if k not in cls.__dataclass_fields__ and v is not None}
        return cls(**fields, metrics=metrics)


def log_text(agent_log: Mapping) -> str:
    """An agent's log as the run store keeps it: JSON, keys sorted, any value JSON has no form for as its text; a
    log JSON cannot write at all (keys of mixed types, a cycle, nesting too deep) as `{"log": its repr}`, cut short
    (`reprlib`), or, where even that fails, its type's name. Never raises."""
    try:
        return json.dumps(agent_log, sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 - keys of two types, a cycle, deep nesting, an int too long, a __str__ that fails
        pass
    try:
        return json.dumps({"log": _LOG_REPR.repr(agent_log)})
    except Exception:  # noqa: BLE001 - as above, in the repr
        return json.dumps({"log": f"<{type(agent_log).__name__}>"})


_LOG_REPR = reprlib.Repr()
_LOG_REPR.maxlevel, _LOG_REPR.maxdict, _LOG_REPR.maxlist, _LOG_REPR.maxstring, _LOG_REPR.maxother = 8, 100, 100, 2000, 200


@dataclass(slots=True)
class EpisodeResult:
    """One played episode: who played which case, how it ended, its ledger and its grade.

    `rewards` holds one number per call: the reward mode's step reward (0.0 in terminal mode),
    with the rubric's reward added at the first accepted report. `agent_log` is whatever the
    agent reports about itself (a model agent: its conversation), kept for transcripts.
    `warehouse` is the final database image, filled only when a sink asks for it.

    `ledger` is the hash-chained ledger's entries. The engine hands over an episode's `Ledger`
    itself when nobody watched its entries as they were written: its chain is then computed when
    the entries are first read (the same hashes, computed once; a run that only prints grades
    never needs them)."""
    episode_id: str
    case_id: str
    family: str
    agent: str
    grade: Grade
    chain: Ledger | list[dict]
    end_reason: str
    error: str = ""
    run_id: str = ""
    rollout: int = 0
    rewards: list[float] = field(default_factory=list)
    agent_log: dict | None = None
    warehouse: bytes | None = None
    started_at: float = 0.0
    seconds: float = 0.0

    @property
    def ledger(self) -> list[dict]:
        """The ledger's entries, each with its `prev_hash` and `hash`."""
        chain = self.chain
        return chain.seal() if isinstance(chain, Ledger) else chain

    @property
    def reward(self) -> float:
        return self.grade.reward

    @property
    def total_reward(self) -> float:
        """The sum of `rewards`: the episode's return under its reward mode."""
        return sum(self.rewards)


@dataclass(frozen=True, slots=True)
class StoredEpisode:
    """An episode as the run store holds it: enough for the grader to grade it again."""
    episode_id: str
    case: Case | None  # None when the stored case cannot be read
    agent: str
    options: dict
    run_id: str
    rollout: int
    status: str
    end_reason: str
    error: str
    entries: list[dict]
    ledger_digest: str
    mart: float | None
    problems: tuple[str, ...] = ()  # what could not be read (a missing warehouse...)
    case_json: str = ""  # the case as stored (its text)
    case_id: str = ""
    intact: bool = False  # its sealed record, its case and its ledger are as gate wrote them (nothing above failed)
