"""gate as a verifiers v1 `Taskset` (verifiers 0.4, what prime-rl uses; `verifiers.v1` of 0.3.1 too).

    pip install 'gate-pipeline[verifiers-v1]'          # in a venv of its own: verifiers 0.4 needs openai<3
    vf-eval gate-pipeline ...                           # the taskset id is the package name

One task per case (`GateData`: the case id, family and suite, and the case file, so a tool server in
another process finds it). The tools are a per-rollout tool server (`GateToolset`, one MCP tool per
tool of the case's suite, built from `Suite.tools` as `gate run`'s schemas are), holding one engine
`Session` that stops at the first accepted report. The model sees the suite's system prompt and the
same opening as `gate run`.

The reward is the engine's: `GateTask.gate_reward` plays the trace's tool calls, in order, on a fresh
episode of the case (as `gate replay` does) and grades it in the one grader, so the score depends on
what the model called and on nothing the tool server or the model says about it. Each call is played with
the arguments the MCP server handed its tool, as the MCP library makes them (`handed`); a call that never
reached the tools live (refused by verifiers' chat loop or by the server) is left out. The rubric's four
terms, `bad_batches_loaded`, `revenue_error_usd` and `finished` are recorded as metrics.
"""
from __future__ import annotations

import inspect
import json
import types
from functools import lru_cache
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.mcp import Toolset, ToolsetConfig

from ..kernel.actions import tool_call_action
from ..kernel.engine import Session
from ..kernel.pool import CasePool, default_cases_file
from ..kernel.records import TERMS
from ..kernel.settings import Settings
from ..kernel.suite import Tool
from ..model_agent.prompt import OPENING
from ..model_agent.tool_schemas import as_method

METRICS = (*TERMS, "bad_batches_loaded", "revenue_error_usd", "finished")
DEFAULT_MAX_STEPS = 64


@lru_cache(maxsize=8)
def case_pool(cases_path: str) -> CasePool:
    """One pool per case file in a process (the host's scoring, a tool server), each case prepared once."""
    return CasePool.from_file(cases_path)


class GateData(vf.TaskData):
    case_id: str
    family: str = ""
    suite: str = ""
    cases_path: str
    """The case file (absolute), read by the tool server and the scoring alike."""
    max_steps: int = DEFAULT_MAX_STEPS


class GateTaskConfig(vf.TaskConfig):
    suite: str | None = None
    """The suite whose tools the rollouts get (default: the default suite); a case file's cases are of it."""


class GateTasksetConfig(vf.TasksetConfig):
    task: GateTaskConfig = GateTaskConfig()
    cases_path: str | None = None
    """A case file; default: the `split` split of `task.suite` under GATE_CASES_DIR."""
    split: str = "eval"
    num_cases: int = -1
    max_steps: int = DEFAULT_MAX_STEPS


class GateToolset(Toolset):
    """One rollout's tools: an engine Session on the task's case. Tools are added per suite by
    `toolset_class` (one `@vf.tool` method per tool of the suite)."""
    TOOL_PREFIX = None  # the model calls the suite's tools by their own names

    def __init__(self, config: ToolsetConfig | None = None) -> None:
        super().__init__(config or ToolsetConfig())
        self.session: Session | None = None

    async def setup_task(self, task) -> None:
        data = task.data
        pool = case_pool(data.cases_path)
        self.session = Session(pool.prepared(data.case_id), "verifiers", stop_at_report=True,
                               max_steps=data.max_steps)

    def _step(self, tool: str, args: dict) -> str:
        if self.session is None:
            return json.dumps({"error": "no episode: the tool server has no task"})
        return json.dumps(self.session.step({"tool": tool, "args": args}).result, default=str)


def _func_metadata(fn) -> Any:
    """The MCP library's view of a tool function's arguments, as the tool server builds it (`func_metadata`: mcp 2
    under `mcp.server.mcpserver`, verifiers 0.4's; mcp 1 under `mcp.server.fastmcp`, verifiers 0.3.1's)."""
    try:
        from mcp.server.mcpserver.utilities.func_metadata import func_metadata
    except ImportError:
        from mcp.server.fastmcp.utilities.func_metadata import func_metadata
    return func_metadata(fn)


@lru_cache(maxsize=None)
def _arguments_of(suite_name: str, tool_name: str) -> Any:
    """The tool server's argument metadata of one tool of the suite's toolset: the method it registers, bound (the
    server registers the toolset's bound methods, so `self` is no argument)."""
    method = getattr(toolset_class(suite_name), tool_name)
    return _func_metadata(types.MethodType(method, object()))


def handed(suite_name: str, tool_name: str, args: dict) -> dict | None:
    """What the tool server hands the tool for the arguments a model sent, by the MCP library's own rules
    (`pre_parse_json`: text that is JSON of a list or an object is read as JSON; then the tool's argument model:
    arguments it does not declare dropped, the rest validated), so the graded replay plays the calls that ran
    live; None when the server refuses them (a batch id that is a number, a list that is no list), and the
    tool is never called. A load sent with an argument the tool does not take loaded live, and a report listing
    its batches as JSON text was received; a replay of the model's own arguments refused both."""
    metadata = _arguments_of(suite_name, tool_name)
    try:
        return metadata.arg_model.model_validate(metadata.pre_parse_json(args)).model_dump_one_level()
    except Exception:  # noqa: BLE001 - what the library raises (a ValidationError; a RecursionError for JSON text
        return None  # nested past the decoder's depth) the server answers as the tool's error, and the tool never runs


def _tool_method(tool: Tool, suite) -> Any:
    async def call(self, **kwargs) -> str:  # the arguments the server validated (`handed`)
        return self._step(tool.name, kwargs)

    return vf.tool(as_method(tool, suite, call, inspect.Parameter.KEYWORD_ONLY))


@lru_cache(maxsize=None)
def toolset_class(suite_name: str) -> type:
    """The GateToolset subclass with the suite's tools."""
    from ..kernel.suite import suites
    suite = suites.get(suite_name)
    namespace = {tool.name: _tool_method(tool, suite) for tool in suite.tools}
    return type(f"Gate{suite.name.title().replace('-', '').replace('_', '')}Toolset", (GateToolset,), namespace)


def _calls(trace, suite) -> list[dict]:
    """The trace's tool calls, in order, as engine actions, each with the arguments the tool server handed its tool.
    A call that never reached the episode live is left out: arguments verifiers' chat loop does not send (text that
    is not JSON, JSON that is not an object: it answers the model itself), a tool the suite has not, and arguments
    the server refuses (`handed`)."""
    tools = set(suite.tool_names)
    actions = []
    for message in trace.assistant_messages:
        for call in message.tool_calls or []:
            if call.name not in tools:
                continue
            try:  # as the chat loop reads them before it calls the tool server
                sent = json.loads(call.arguments or "{}")
            except (ValueError, RecursionError):
                continue
            args = handed(suite.name, call.name, sent) if isinstance(sent, dict) else None
            if args is not None:
                actions.append(tool_call_action(call.name, args))
    return actions


def grade_trace(data: GateData, trace) -> dict:
    """The engine's grade of the trace's calls on a fresh episode of the case (stopping at the first
    accepted report, as the tool server does)."""
    prepared = case_pool(data.cases_path).prepared(data.case_id)
    session = Session(prepared, "verifiers", stop_at_report=True, max_steps=data.max_steps)
    for action in _calls(trace, prepared.suite):
        if session.done:
            break
        session.step(action)
    result = session.finish()
    return {**result.grade.as_dict(), "calls": len(result.ledger)}


def _suite_name(config) -> str:
    from ..kernel.suite import suites
    name = getattr(config, "suite", None)
    return suites.get(name).name if name else suites.default().name


class GateTask(vf.Task[GateData, vf.State, GateTaskConfig]):
    """One case; the rollout's tools are its suite's (`toolset_class`)."""

    @property
    def key(self) -> str:
        return self.data.case_id

    @classmethod
    def toolsets(cls, config) -> list:
        """A tool server per rollout, with the tools of the config's suite."""
        return [toolset_class(_suite_name(config))()]

    def _grade(self, trace) -> dict:
        kept = trace.info.get("gate_grade")
        if not isinstance(kept, dict):
            kept = trace.info["gate_grade"] = grade_trace(self.data, trace)
        return kept

    @vf.metric
    async def gate_metrics(self, trace) -> dict:
        grade = self._grade(trace)
        return {key: float(grade.get(key) or 0.0) for key in METRICS}

    @vf.reward
    async def gate_reward(self, trace) -> float:
        """gate's reward: from what reached the warehouse and the ledger (no report, no credit)."""
        return float(self._grade(trace)["reward"])


def _with_id(**fields) -> dict:
    """`id` where this verifiers' TaskData has it (0.4 does, 0.3.1's v1 does not)."""
    if "id" not in vf.TaskData.model_fields:
        fields.pop("id", None)
    return fields


class GateTaskset(vf.Taskset[GateTask, GateTasksetConfig]):
    """gate's cases of one suite and split (default: the default suite's 32 curated eval cases)."""

    def load(self):
        config = self.config
        if config.cases_path:
            path = Path(config.cases_path)
        else:
            settings = Settings.from_env()  # the taskset's load is a process entry point
            settings.register_suites()
            path = default_cases_file(settings, config.split, config.task.suite)
        path = path.resolve()
        pool = case_pool(str(path))
        if pool.suite.name != _suite_name(config.task):
            raise ValueError(f"{path}: its cases are of the {pool.suite.name} suite, the taskset's tools are "
                             f"{_suite_name(config.task)}'s; set task.suite = {pool.suite.name!r}")
        cases = pool.cases if config.num_cases < 0 else pool.cases[:config.num_cases]
        for case in cases:
            yield GateTask(GateData(**_with_id(
                id=case.case_id, name=case.case_id, prompt=OPENING, system_prompt=pool.suite.prompt,
                case_id=case.case_id, family=case.family, suite=case.suite, cases_path=str(path),
                max_steps=config.max_steps)), config.task)


__all__ = ["GateData", "GateTask", "GateTaskConfig", "GateTaskset", "GateTasksetConfig", "GateToolset", "grade_trace", "toolset_class"]
