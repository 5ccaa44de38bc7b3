"""gate as a verifiers 0.3 environment (the classic `load_environment` API), for `vf-eval` and RL trainers.

    pip install 'gate-pipeline[verifiers]'
    vf-eval gate_pipeline.integrations.verifiers_env -m MODEL -b BASE_URL -n 32 -r 3

One dataset row per case (the case id rides in `info`); each rollout gets its own engine
`Session` (a private SQLite copy of the prepared case) in `setup_state`. The model sees the
same system prompt and the same seven tool schemas as `gate run`, and every tool call goes to
the session as an action, through the one action parser, so malformed calls are refused and
logged exactly as there; a reply with no tool call gets the same nudge. An accepted
submit_report ends the rollout. The reward is gate's grade (no report, no credit); the four
terms and the two metrics are logged at weight 0.
verifiers 0.4 dropped this API (it ships only `verifiers.v1`), so the extra pins 0.3.1.
"""
from __future__ import annotations

import json

import verifiers as vf
from verifiers.types import ToolMessage, UserMessage

from ..kernel.engine import Session
from ..kernel.pool import CasePool
from ..kernel.records import TERMS
from ..kernel.settings import Settings
from ..kernel.suite import Suite
from ..model_agent.limits import MAX_CALLS_PER_REPLY
from ..model_agent.prompt import NUDGE, OPENING
from ..model_agent.tool_schemas import tool_schemas

DROPPED = f"not played: a reply plays at most {MAX_CALLS_PER_REPLY} tool calls"

METRICS = (*TERMS, "bad_batches_loaded", "revenue_error_usd", "finished")


def _tool_defs(suite: Suite) -> list[dict]:
    return [{"name": f["function"]["name"], "description": f["function"]["description"],
             "parameters": f["function"]["parameters"]} for f in tool_schemas(suite)]


def _grade_of(state) -> dict:
    return state.get("gate_grade") or {"reward": 0.0}


async def gate_reward(state) -> float:
    """gate's reward for the rollout: from what reached the warehouse and the ledger."""
    return float(_grade_of(state)["reward"])


def _metric(key: str):
    async def metric(state) -> float:
        return float(_grade_of(state).get(key, 0.0))
    metric.__name__ = key
    return metric


class GateEnv(vf.MultiTurnEnv):
    """One gate night per rollout; the episode lives in the rollout's state."""

    def __init__(self, cases, max_turns: int = 30, **kwargs):
        from datasets import Dataset
        self.pool = cases if isinstance(cases, CasePool) else CasePool(cases)  # one suite: its tools, its prompt
        rows = [{"question": OPENING, "answer": "", "info": {"case_id": c.case_id, "family": c.family}}
                for c in self.pool]
        rubric = vf.Rubric(funcs=[gate_reward, *(_metric(k) for k in METRICS)],
                           weights=[1.0] + [0.0] * len(METRICS))
        kwargs.setdefault("pass_threshold", 1.0)  # pass@k / pass^k as gate counts them: reward 1.0
        suite = self.pool.suite
        super().__init__(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows),
                         system_prompt=suite.prompt, rubric=rubric, tool_defs=_tool_defs(suite),
                         max_turns=max_turns, **kwargs)

    async def setup_state(self, state):
        info = state["info"]
        case_id = info.get("case_id") if isinstance(info, dict) else None
        if case_id not in self.pool:
            raise vf.Error(f"no gate case {case_id!r} in this environment")
        state["gate_session"] = Session(self.pool.prepared(case_id), "verifiers", stop_at_report=True)
        state["gate_counts"] = {"tool_calls": 0, "tool_errors": 0, "nudges": 0, "dropped_calls": 0}
        return state

    async def env_response(self, messages, state, **kwargs):
        session: Session = state["gate_session"]
        counts = state["gate_counts"]
        calls = getattr(messages[-1], "tool_calls", None) or []
        if not calls:
            counts["nudges"] += 1
            return [UserMessage(content=NUDGE)]
        out = []
        for n, call in enumerate(calls):
            if n >= MAX_CALLS_PER_REPLY:  # answered (every call of the reply must be), never played
                counts["dropped_calls"] += 1
                result = {"error": DROPPED}
            else:
                counts["tool_calls"] += 1
                result = session.step({"tool": call.name, "args": call.arguments}).result
                counts["tool_errors"] += isinstance(result, dict) and "error" in result
            out.append(ToolMessage(tool_call_id=call.id, content=json.dumps(result, default=str)))
        if session.reported:
            state["final_env_response"] = out
        return out

    @vf.cleanup
    async def grade_and_close(self, state) -> None:
        """Grade before the episode's database goes away (scoring runs after cleanup)."""
        session = state.get("gate_session")
        if session is None:
            return
        result = session.finish()
        state["gate_grade"] = {**result.grade.as_dict(), "ledger": result.ledger,
                               "counts": state.get("gate_counts", {})}
        state["gate_session"] = None


def load_environment(cases_path: str | None = None, num_cases: int = -1, max_turns: int = 30,
                     **kwargs) -> GateEnv:
    """The gate environment over a case file (default: the 32 curated eval cases)."""
    settings = Settings.from_env()  # vf-eval's entry point
    settings.register_suites()
    pool = CasePool.from_file(cases_path) if cases_path else CasePool.default(settings, "eval")
    cases = pool.cases
    if num_cases is not None and num_cases >= 0:
        cases = cases[:num_cases]
    if not cases:
        raise ValueError(f"{cases_path}: no cases")
    return GateEnv(cases if len(cases) < len(pool) else pool, max_turns=max_turns, **kwargs)
