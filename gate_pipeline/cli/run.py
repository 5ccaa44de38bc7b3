"""`gate run`: a model (any OpenAI-compatible endpoint) plays the cases; transcripts, tables, pass^k.

    gate run --model NAME --base-url URL [--cases FILE] [-n N] [-r ROLLOUTS] [-c CONCURRENCY]
             [--run-id ID] [--api-key-env VAR] [--max-turns N] [--max-tokens N] [--timeout S]
             [--tool-choice auto|required|none] [--text-tool-calls]

Transcripts go to runs/<run-id>/transcripts.jsonl; the same --run-id resumes a run, after any number of
Ctrl-C, SIGTERM (handled as Ctrl-C: what Slurm and Kubernetes send) or kill -9.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from ..kernel.settings import Settings
from ..model_agent.limits import MAX_CALLS_PER_REPLY, MAX_RETRIES
from .common import CASES_HELP, cases_arg, int_arg, positive_arg
from .errors import UsageError

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
SERVER_FAULTS = ("api_error", "timeout")  # the server's failure, not the model's: no credit, redone on resume


@contextmanager
def _rollout_bar(total: int):
    """A rich bar on stderr (only on a terminal): rollouts done and the mean reward so far."""
    if total == 0 or not sys.stderr.isatty():
        yield lambda record: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    rewards = []
    with Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[mean]}"),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("rollouts", total=total, mean="")

        def advance(result):
            rewards.append(result.reward)
            prog.update(task, advance=1, mean=f"mean reward {sum(rewards) / len(rewards):.4f}")
        yield advance


TERMINATED = object()


async def _until_sigterm(coro):
    """`coro`, cancelled by SIGTERM as Ctrl-C cancels it (what a scheduler sends): every rollout in flight is
    recorded as cut off before the run stops. TERMINATED when SIGTERM stopped it."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = []

    def on_term() -> None:
        terminated.append(True)
        task.cancel()  # type: ignore[union-attr]

    try:
        loop.add_signal_handler(signal.SIGTERM, on_term)
    except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not the main thread)
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated:
            return TERMINATED
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


# the most a run may ask for: beyond these a run is a typo (a billion rollouts were allocated before the endpoint was
# asked whether it is there)
MAX_ROLLOUTS, MAX_CONCURRENCY, MAX_TURNS, MAX_TOKENS = 10_000, 4_096, 1_024, 10_000_000


def _settings(a):
    from ..model_agent.agent import ModelSettings
    key_env = a.api_key_env or DEFAULT_KEY_ENV
    if a.api_key_env and not os.environ.get(a.api_key_env):
        raise UsageError(f"--api-key-env {a.api_key_env}: that environment variable is not set")
    return ModelSettings(model=a.model, base_url=a.base_url, api_key_env=key_env, temperature=a.temperature,
                         max_turns=a.max_turns, timeout=a.timeout, retries=a.retries, max_tokens=a.max_tokens,
                         tool_choice=a.tool_choice, text_tool_calls=a.text_tool_calls)


def _summary_lines(records: list[dict], new: int, kept: int, path: Path) -> list[str]:
    ends = Counter(r["end_reason"] for r in records)
    counts = Counter()
    usage = Counter()
    for r in records:
        counts.update(r["counts"])
        usage.update(r["usage"])
    lines = [f"run {path.parent.name}: {len(records)} rollouts ({new} played now, {kept} kept from before); "
             f"transcripts {path}",
             "ended: " + ", ".join(f"{k} {ends[k]}" for k in ("reported", "max_turns", "timeout", "api_error")),
             "tool calls {tool_calls}, tool errors {tool_errors}, invalid JSON {invalid_json}, not an object "
             "{not_an_object}, unknown tool {unknown_tool}, bad arguments {bad_arguments}, nudges {nudges}, "
             "retries {retries}".format(**{k: counts.get(k, 0) for k in
                                            ("tool_calls", "tool_errors", "invalid_json", "not_an_object",
                                             "unknown_tool", "bad_arguments", "nudges", "retries")})]
    if counts.get("text_tool_calls") or counts.get("after_report") or counts.get("dropped_calls"):
        lines.append(f"of the tool calls: written as text {counts.get('text_tool_calls', 0)}, after an accepted "
                     f"report (refused) {counts.get('after_report', 0)}, beyond {MAX_CALLS_PER_REPLY} in a reply "
                     f"(dropped) {counts.get('dropped_calls', 0)}")
    if usage:
        lines.append("tokens: " + ", ".join(f"{k} {usage[k]:,}" for k in ("prompt_tokens", "completion_tokens",
                                                                           "total_tokens") if k in usage))
    return lines


def no_tool_call_warning(records: list[dict], settings) -> str | None:
    """One line when the model's replies in this run carried no tool call at all (a server without a tool
    parser, a model that does not call tools), naming what may help."""
    replies = sum(r["counts"].get("replies", 0) for r in records)
    if not replies or any(r["counts"].get("tool_calls", 0) for r in records):
        return None
    hints = [h for h, off in (("--tool-choice required", settings.tool_choice != "required"),
                              ("--text-tool-calls", not settings.text_tool_calls)) if off]
    return (f"gate: warning: none of the model's {replies} replies carried a tool call: the server may need a tool "
            f"parser (vLLM: --enable-auto-tool-choice --tool-call-parser NAME)"
            + (f", or try {' or '.join(hints)}" if hints else ""))


def cmd_run(a, gate_settings: Settings) -> int:
    from ..kernel.cases import read_cases, split_of
    from ..model_agent.passk import pass_rates, pass_table
    from ..model_agent.rollouts import TRANSCRIPTS, EndpointError, check_run_id, default_run_id, run_rollouts
    from ..store import RunStore
    from ..tables import baseline_tables, summary
    from .html_output import html_target, save_html
    settings = _settings(a)
    target = html_target(a.html)
    rollouts, concurrency = a.rollouts, a.concurrency
    path = cases_arg(a, gate_settings)
    cases = read_cases(path)
    if a.n is not None:
        cases = cases[:a.n]
    run_id = check_run_id(a.run_id or default_run_id(settings.model))
    run_dir = Path(a.runs_dir) / run_id
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir} exists and is not a directory")
    total = len(cases) * rollouts
    store = RunStore(gate_settings)
    try:
        with _rollout_bar(total) as advance:
            out = asyncio.run(_until_sigterm(run_rollouts(cases, settings, rollouts, concurrency, run_dir, store,
                                                          on_done=advance, cases_file=path)))
        if out is TERMINATED:
            raise KeyboardInterrupt  # `gate: interrupted`, exit 130, as after Ctrl-C
    except EndpointError as exc:  # the endpoint, not the request, is wrong: nothing to tabulate
        print(f"gate: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        raise UsageError(f"{run_dir}: {exc.strerror or exc}") from None
    finally:
        store.dispose()
    records = out["records"]
    warning = no_tool_call_warning(records, settings)
    if warning:
        print(warning, file=sys.stderr)
    faults = sum(1 for r in records if r["end_reason"] in SERVER_FAULTS)
    if faults:
        print(f"gate: {faults} of {len(records)} rollouts ended on an API error or timeout and are left out of "
              f"the tables; the same --run-id {run_id} retries only those", file=sys.stderr)
    if faults == len(records):
        print("gate: error: no rollout reached the model: nothing to tabulate", file=sys.stderr)
        return 1
    # the report tables take one grade per case: every rollout that reached the model is an episode of its case
    by_key = {(r["case_id"], r["rollout"]): r for r in records if r["end_reason"] not in SERVER_FAULTS}
    played = [(c, by_key[(c.case_id, i)]) for i in range(rollouts) for c in cases if (c.case_id, i) in by_key]
    grades = {settings.model: [r["grade"] for _, r in played]}  # the model's name, as on every surface
    split = split_of(path)
    tables = baseline_tables([c for c, _ in played], grades,
                             split=split if rollouts == 1 else f"{split} x {rollouts} rollouts")
    save_html(target, grades, title=f"gate run {run_id}", subtitle=f"{settings.model} on {len(cases)} cases "
              f"({path}), {rollouts} rollout(s) each", tables=[("Tables", tables)],
              pass_k={settings.model: pass_rates(records, rollouts)})  # first: whatever happens to stdout
    if a.json:
        print(json.dumps({"run_id": run_id, "summary": summary([c for c, _ in played], grades),
                          "pass": pass_rates(records, rollouts),
                          "transcripts": str(run_dir / TRANSCRIPTS)}))
        return 0
    print("\n".join(_summary_lines(records, out["new"], out["kept"], run_dir / TRANSCRIPTS)))
    print()
    print(tables)
    print()
    print(pass_table(records, rollouts))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="run a model (OpenAI-compatible endpoint) on the cases",
        description="A model plays the cases through an OpenAI-compatible chat-completions endpoint; transcripts "
                    "go to RUNS_DIR/RUN_ID/transcripts.jsonl and the same --run-id resumes a run.",
        epilog="examples:\n  gate run --model Qwen/Qwen2.5-7B-Instruct --base-url http://127.0.0.1:8000/v1 -r 3 -c 32\n"
               "  gate run --model gpt-4o-mini --base-url https://api.openai.com/v1 -n 8 --json")
    p.add_argument("--model", required=True, help="model name as the server knows it")
    p.add_argument("--base-url", required=True, help="the API root, e.g. https://api.openai.com/v1 or "
                                                     "http://127.0.0.1:8000/v1")
    p.add_argument("--cases", default=None, help=CASES_HELP)
    p.add_argument("-n", type=int_arg("-n"), default=None, help="only the first N cases (default: all)")
    p.add_argument("-r", "--rollouts", type=int_arg("-r", 1, MAX_ROLLOUTS), default=1, help="rollouts per case (pass^k uses k = this)")
    p.add_argument("-c", "--concurrency", type=int_arg("-c", 1, MAX_CONCURRENCY), default=8, help="rollouts in flight at once")
    p.add_argument("--run-id", default=None, help="runs/<run-id>/; the same id resumes (default: time-model)")
    p.add_argument("--runs-dir", default="runs", help="where run directories go, from the working directory")
    p.add_argument("--api-key-env", default=None, help=f"variable holding the key (default {DEFAULT_KEY_ENV}; "
                                                        "unset is fine for local servers)")
    p.add_argument("--max-turns", type=int_arg("--max-turns", 1, MAX_TURNS), default=30, help="model turns per episode")
    p.add_argument("--max-tokens", type=int_arg("--max-tokens", 1, MAX_TOKENS), default=None,
                   help="the most tokens a reply may have (default: the server's)")
    p.add_argument("--tool-choice", choices=("auto", "required", "none"), default=None,
                   help="the API's tool_choice (default: not sent, the server decides; required makes a server that "
                        "supports it answer with a tool call)")
    p.add_argument("--text-tool-calls", action="store_true",
                   help="also read tool calls a reply writes as text (Hermes <tool_call> JSON, a bare JSON object), "
                        "for servers without a tool parser; counted apart in the summary")
    p.add_argument("--timeout", type=positive_arg("--timeout"), default=60.0, help="seconds per request")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    p.add_argument("--retries", type=int_arg("--retries", 0, MAX_RETRIES), default=3, help="the client's retries per request on 408/409/429/5xx "
                                                          "and connection errors, with its backoff")
    p.add_argument("--json", action="store_true", help="print the summary, pass rates and transcript path as JSON")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    p.set_defaults(fn=cmd_run)
