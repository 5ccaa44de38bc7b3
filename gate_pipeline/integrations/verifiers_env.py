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

from ..cases import read_cases, suite_of_cases
from ..engine import Session
from ..grader import TERMS
from ..model_agent.prompt import NUDGE, OPENING, SYSTEM_PROMPTS
from ..model_agent.tool_schemas import tool_schemas
from ..settings import Settings
from ..suites import prepare
from ..world import PreparedCase

METRICS = (*TERMS, "bad_batches_loaded", "revenue_error_usd", "finished")


def _tool_defs(suite: str = "classic") -> list[dict]:
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

    def __init__(self, cases: list[dict], max_turns: int = 30, **kwargs):
        from datasets import Dataset
        self.cases = {c["case_id"]: c for c in cases}
        self._prepared: dict[str, PreparedCase] = {}
        rows = [{"question": OPENING, "answer": "", "info": {"case_id": c["case_id"], "family": c["family"]}}
                for c in cases]
        rubric = vf.Rubric(funcs=[gate_reward, *(_metric(k) for k in METRICS)],
                           weights=[1.0] + [0.0] * len(METRICS))
        kwargs.setdefault("pass_threshold", 1.0)  # pass@k / pass^k as gate counts them: reward 1.0
        suite = suite_of_cases(cases)  # one suite per environment: its tools and its prompt
        if suite == "classic" and any(c.get("suite") for c in cases):
            raise ValueError("cases: one suite per environment (classic and v2 cases are mixed)")
        super().__init__(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows),
                         system_prompt=SYSTEM_PROMPTS[suite], rubric=rubric, tool_defs=_tool_defs(suite),
                         max_turns=max_turns, **kwargs)

    def _prepared_case(self, case_id: str) -> PreparedCase:
        if case_id not in self._prepared:
            self._prepared[case_id] = prepare(self.cases[case_id])
        return self._prepared[case_id]

    async def setup_state(self, state):
        info = state["info"]
        case_id = info.get("case_id") if isinstance(info, dict) else None
        if case_id not in self.cases:
            raise vf.Error(f"no gate case {case_id!r} in this environment")
        state["gate_session"] = Session(self._prepared_case(case_id), "verifiers")
        state["gate_counts"] = {"tool_calls": 0, "tool_errors": 0, "nudges": 0}
        return state

    async def env_response(self, messages, state, **kwargs):
        session: Session = state["gate_session"]
        counts = state["gate_counts"]
        calls = getattr(messages[-1], "tool_calls", None) or []
        if not calls:
            counts["nudges"] += 1
            return [UserMessage(content=NUDGE)]
        out = []
        for call in calls:
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
    path = cases_path or Settings.from_env().cases_file("eval")
    cases = read_cases(path)
    if num_cases is not None and num_cases >= 0:
        cases = cases[:num_cases]
    if not cases:
        raise ValueError(f"{path}: no cases")
    return GateEnv(cases, max_turns=max_turns, **kwargs)
