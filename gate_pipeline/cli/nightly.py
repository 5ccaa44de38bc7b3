"""`gate nightly` runs the nightly benchmark job in process and prints the scoreboard.

The nightly run uses an ephemeral Dagster instance (nothing to set up) and the run store
under GATE_HOME, so each night's summary joins the scoreboard's history. While it plays, the
process holds a lock under GATE_HOME (`store.hold_lock`): a night whose process died (kill -9,
a reboot) is closed at the next start (its open episodes end as abandoned, graded 0 with the
reason; `gate verify` reports them), and by the grading sensor.
"""
from __future__ import annotations

import gc
import json
import sys
import uuid
from pathlib import Path

from ..kernel import strict_json
from ..kernel.cases import printable
from ..kernel.settings import Settings
from .common import CASES_HELP, agent_list, agents_epilog, cases_arg, int_arg, resolve_agents
from .errors import UsageError
from .progress import polled_progress


def _options(text: str | None):
    if text is None:
        return None
    try:
        value = strict_json.loads(text)
    except strict_json.KeyTwice as exc:
        raise UsageError(f"--agent-options {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--agent-options is not JSON ({exc.msg})") from None
    except RecursionError:
        raise UsageError("--agent-options is not JSON gate reads (nested too deep)") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UsageError(f"--agent-options is not JSON gate reads ({exc})") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise UsageError("--agent-options must be a JSON object {agent: {option: value}}")
    return value


def _shown(name) -> str:
    """A stored name as one line shows it: escaped where not printable (no line or escape of its own), cut."""
    text = printable(name)
    return text if len(text) <= 80 else text[:80] + "..."


def _reward(value) -> str:
    """A stored mean reward as the history shows it (one outside 0..1, which no night gives, as '?')."""
    return f"{value:.4f}" if isinstance(value, (int, float)) and 0.0 <= value <= 1.0 else "?"


def _step_message(failure) -> str:
    """What a failed step says, first line: a step's Failure its own description, anything else the
    innermost cause's message (what went wrong, not where)."""
    description = failure.user_failure_data.description if failure.user_failure_data is not None else None
    if not description:
        error = failure.error
        while error.cause is not None:
            error = error.cause
        description = error.message
    lines = [ln for ln in description.strip().splitlines() if ln.strip()]
    return lines[0] if lines else "the nightly run failed"


def _interrupted(error) -> bool:
    while error is not None:
        if error.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
            return True
        error = error.cause
    return False


def cmd_nightly(a, settings: Settings) -> int:
    collecting = gc.isenabled()
    # the imports (Dagster, gate's definitions) make long-lived objects, not garbage: the collector
    # paused while they run, so it does not walk the growing heap again and again; back on to play
    gc.disable()
    try:
        return _night(a, settings, collecting)
    finally:
        if collecting:
            gc.enable()


def _night(a, settings: Settings, collecting: bool) -> int:
    from ..html_report import PageProcess
    from ..kernel.cases import cases_of_text, read_case_text, suite_of_cases
    from .html_output import html_target
    target = html_target(a.html)
    cases_file = str(cases_arg(a, settings))
    text = read_case_text(cases_file)
    cases = cases_of_text(text, str(Path(cases_file)))  # a bad case file is one line too
    agents = agent_list(a.agents, list(suite_of_cases(cases).report_agents))
    options = _options(a.agent_options) or {}
    resolve_agents(agents, settings, options)  # an unknown agent, or options for one not played: one line, first
    from ..store import RunStore
    store = RunStore(settings, once=True)  # the night's steps share its engine (`once`)
    for run_id, closed in store.close_dead_runs():  # a night whose process died: closed before this one starts
        print(f"gate: closed night {run_id}, whose process died: {len(closed)} episode(s) abandoned "
              f"(graded 0; `gate verify` reports them)", file=sys.stderr)

    from ..dagster_defs import location
    unlisted = location.allow_agents(agents)  # the names given here may be played by this process's run
    if unlisted:
        store.dispose()
        raise UsageError(f"agent {unlisted[0]!r} is not one this process's Dagster code location lists; name it in "
                         f"GATE_AGENTS")

    # the page's process: it imports matplotlib while this one loads Dagster and plays, then draws the page
    pages = PageProcess()
    try:
        return _play_night(a, settings, collecting, store, cases_file, text, cases, agents, options, target, pages)
    finally:
        pages.close()


def _play_night(a, settings: Settings, collecting: bool, store, cases_file: str, text: str, cases: list,
                agents: list[str], options: dict, target, pages) -> int:
    import dagster as dg

    from ..dagster_defs.definitions import defs
    from ..dagster_defs.jobs import nightly_run_config, nightly_tags
    from ..dagster_defs.scoreboard import draw_pages_in, remember_cases
    from ..kernel.records import Grade
    from ..store import COMPLETE, ENDED, STOPPED, RunStore, hold_lock, process_name
    from .html_output import save_html
    remember_cases(cases_file, text, cases)  # checked once: the night's plan reads the same file

    config = {**nightly_run_config(cases_file, agents, options or None, a.chunk_size),
              "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    episodes = len(cases) * len(agents)
    ended_before = store.count_episodes(ENDED)
    run_id = str(uuid.uuid4())
    lock = store.run_lock(run_id)
    instance = dg.DagsterInstance.ephemeral()  # its storages' modules imported while the collector is paused too
    # what the imports made (Dagster, the code location's definitions) is never garbage: out of the
    # collector's way while the night plays, so each full collection does not walk it again
    gc.freeze()
    if collecting:
        gc.enable()
    draw_pages_in(pages)
    try:
        with instance, hold_lock(lock, process_name("gate nightly")), \
                polled_progress(episodes, "episodes", lambda: store.count_episodes(ENDED) - ended_before,
                                enabled=not a.json):
            result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
                run_config=config, instance=instance, raise_on_error=False, run_id=run_id,
                tags={"gate/trigger": "cli", **nightly_tags(cases_file, agents)})
    finally:
        draw_pages_in(None)
        gc.unfreeze()
        manifest = store.manifest(run_id)
        if manifest is not None and manifest["status"] != COMPLETE:
            store.close_run(run_id, STOPPED)  # interrupted or failed: it will not complete
        lock.unlink(missing_ok=True)
        store.dispose()
    if not result.success:
        errors = [e.event_specific_data.error for e in result.all_events
                  if (e.is_step_failure or e.is_run_failure) and getattr(e.event_specific_data, "error", None)]
        if any(_interrupted(error) for error in errors):
            raise KeyboardInterrupt  # Ctrl-C: `gate: interrupted`, exit 130, as every command
        failures = [_step_message(e.step_failure_data) for e in result.all_events
                    if e.is_step_failure and e.step_failure_data.error is not None]
        raise UsageError(failures[0] if failures else "the nightly run failed")
    board = result.output_for_node("scoreboard")
    grades = {agent: [Grade.from_dict(g) for g in gs] for agent, gs in board["grades"].items()}
    try:
        pages.wait()  # the scoreboard's page, sent when the scoreboard was made
    except OSError as exc:
        raise UsageError(f"the scoreboard page {exc.filename}: cannot write ({exc.strerror or exc})") from None
    except ValueError as exc:  # what drawing it raised (drawn in this process, it failed the scoreboard's step)
        raise UsageError(f"the scoreboard page: {exc}") from None
    save_html(target, grades, pages, title="gate nightly scoreboard",
              subtitle=f"{Path(cases_file).name}: {', '.join(grades)}", tables=[("Tables", board["tables"])])
    if a.json:
        print(json.dumps(board["summary"]))
        return 0
    print(board["tables"])
    history = RunStore(settings, once=True).nightly_history(5)
    print("\nnightly history (mean reward):")
    for night in history:  # a stored summary is a cache anyone with the store could edit: shown, never obeyed
        s = night["summary"]
        cells = "  ".join(f"{_shown(n)} {_reward(v['reward'])}" for n, v in s["agents"].items())
        print(f"  night {night['night']:>4}  {_shown(Path(str(s.get('cases_file') or '')).name)}  {cells}")
    for line in board["regressions"]:
        print(f"REGRESSION {line}")
    return 0


def register(subparsers) -> None:
    n = subparsers.add_parser(
        "nightly", help="run the nightly benchmark job in process and print the scoreboard",
        description="The nightly_benchmark Dagster job, in process on an ephemeral instance; the night joins the "
                    "history in the run store under GATE_HOME.",
        epilog=agents_epilog(["gate nightly", "gate nightly --agents careful,careful@no-orders.amount.out_of_range --json",
                              "gate nightly --agents careful --agent-options "
                              "'{\"careful\": {\"without\": [\"orders.amount.out_of_range\"]}}'"]))
    n.add_argument("--cases", default=None, help=CASES_HELP)
    n.add_argument("--agents", default=None, help="comma-separated agent names (default: naive,careful,refuse-all)")
    n.add_argument("--agent-options", default=None, metavar="JSON",
                   help='options for agents\' constructors, {"agent": {"option": value}} (default: none)')
    n.add_argument("--chunk-size", type=int_arg("--chunk-size"), default=None, help="cases per Dagster step (default: from the case count, at least 8)")
    n.add_argument("--json", action="store_true", help="print the scoreboard's figures as JSON")
    n.add_argument("--html", default=None, metavar="FILE", help="also write the scoreboard as a self-contained HTML page")
    n.set_defaults(fn=cmd_nightly)
