"""`gate`: generate cases, report baselines, run attackers, replay trajectories.

Every command is a thin caller of the one engine (`gate_pipeline.engine`). Every error a user
can cause (a bad flag, a missing or malformed file, an unknown agent) ends in one line on
stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..actions import TrajectoryError
from ..agents import ATTACKERS, V2_ATTACKERS, AgentOptionError, UnknownAgent
from ..cases import CaseError, read_cases, split_of, suite_of_cases
from ..contract import ContractError
from .common import (
    CASES_HELP,
    WORKERS_HELP,
    Parser,
    agent_list,
    agents_epilog,
    cases_arg,
    cli_settings,
    grades_json,
    grades_of,
    play_with_progress,
    resolve_agents,
    workers_arg,
)
from .errors import UsageError

# Subcommands that live in their own modules: each has register(subparsers).
EXTENSIONS: tuple[str, ...] = ("experiment", "nightly", "run", "serve", "ui", "verify")

REPORT_AGENTS = ["naive", "careful", "refuse-all"]
REWARD_CHOICES = ("terminal", "dense", "potential")  # rewards.REWARD_MODES, without importing it here
ATTACK_AGENTS = ["careful", *ATTACKERS, "profile-only"]
# suite v2 case files: its baselines next to the classic ones, its attackers (and three classic ones) against careful-v2
V2_REPORT_AGENTS = ["naive", "careful", "careful-v2", "refuse-all"]
V2_ATTACK_AGENTS = ["careful-v2", *V2_ATTACKERS, "report-liar", "load-then-quarantine", "inspect-theatre"]


def report_agents(cases) -> list[str]:
    return V2_REPORT_AGENTS if suite_of_cases(cases) == "v2" else REPORT_AGENTS


def cmd_cases_generate(a) -> int:
    from ..generator import generate_suite
    settings = cli_settings()
    splits = ("eval", "train") if a.split == "both" else (a.split,)
    try:
        paths = generate_suite(a.suite, a.out or f"cases/{a.suite}", settings.contracts_dir, a.rows, splits)
    except ValueError as exc:
        if isinstance(exc, ContractError):
            raise
        raise UsageError(str(exc))
    for p in paths:
        print(p)
    return 0


def rows_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--rows must be a whole number, not {text!r}") from None
    if not 20 <= value <= 10_000_000:  # suite_v2.generator.MIN_ROWS, MAX_ROWS (not imported at start-up)
        raise UsageError(f"--rows must be between 20 and 10,000,000, not {value}")
    return value


def cmd_report(a) -> int:
    from .html_output import html_target, save_html
    if a.html and a.reward != "terminal":
        raise UsageError(f"--html draws the terminal-reward report; drop --reward {a.reward}")
    target = html_target(a.html)
    settings = cli_settings()
    path = cases_arg(a, settings)
    cases = read_cases(path)
    if a.reward != "terminal":
        from .dense import DENSE_AGENTS, dense_report
        specs = resolve_agents(agent_list(a.agents, list(DENSE_AGENTS)), settings, {"random": {"seed": a.seed}})
        return dense_report(a, cases, specs, path)
    specs = resolve_agents(agent_list(a.agents, report_agents(cases)), settings)
    grades = grades_of(play_with_progress(cases, specs, workers=a.workers, show=not a.json))
    from ..tables import baseline_tables
    tables = baseline_tables(cases, grades, split=split_of(path)) if target is not None or not a.json else ""
    save_html(target, grades, title="gate report", subtitle=f"{len(cases)} cases ({path})",
              tables=[("Tables", tables)])  # first: a closed stdout must not lose the page
    print(grades_json(grades) if a.json else tables)
    return 0


def cmd_attacks(a) -> int:
    settings = cli_settings()
    cases = read_cases(cases_arg(a, settings))
    v2 = suite_of_cases(cases) == "v2"
    grades = grades_of(play_with_progress(
        cases, resolve_agents(agent_list(a.agents, V2_ATTACK_AGENTS if v2 else ATTACK_AGENTS), settings),
        workers=a.workers, show=not a.json))
    if a.json:
        print(grades_json(grades))
    else:
        from ..tables import attacker_table
        print(attacker_table(grades, target="careful-v2" if v2 else "careful"))
    return 0


def cmd_replay(a) -> int:
    from ..actions import parse_trajectories
    from ..engine import replay
    from ..suites import prepare
    from ..world import PreparedCase
    settings = cli_settings()
    path = cases_arg(a, settings)
    cases = {c["case_id"]: c for c in read_cases(path)}
    try:
        text = Path(a.trajectories).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{a.trajectories}: cannot read trajectories ({getattr(exc, 'strerror', None) or exc})")
    items = parse_trajectories(text, a.trajectories)
    for case_id, _ in items:
        if case_id not in cases:
            raise UsageError(f"{a.trajectories}: no case {case_id!r} in {path}")
    prepared: dict[str, PreparedCase] = {}
    for case_id, actions in items:
        if case_id not in prepared:
            prepared[case_id] = prepare(cases[case_id])
        results, episode = replay(prepared[case_id], actions, reward=a.reward)
        g = episode.grade
        if a.json:
            out = {"case_id": case_id, "results": results, "ledger": episode.ledger, "grade": g.as_dict(),
                   "revenue": g.revenue}
            if a.reward != "terminal":
                out["rewards"] = episode.rewards
                out[f"{a.reward}_return"] = episode.total_reward
            print(json.dumps(out))
        else:
            print(f"{case_id:<28} reward {g.reward:.4f}  calls {len(results)}  "
                  f"ledger {'intact' if g.ledger_intact else 'BROKEN'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    p = Parser(prog="gate", description="gate: does a tool-using agent stop a bad batch before it becomes a "
                                        "wrong number?", epilog="run `gate COMMAND --help` for a command's options")
    p.add_argument("--version", action="version", version=f"gate {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=Parser, title="commands", metavar="COMMAND")

    cases = sub.add_parser("cases", help="write a suite's case files", description="Case files.")
    csub = cases.add_subparsers(dest="cases_command", parser_class=Parser, title="commands", metavar="COMMAND")
    gen = csub.add_parser("generate", help="write a suite's case files (byte-identical on every run)",
                          epilog="examples:\n  gate cases generate --suite classic --out /tmp/cases\n"
                                 "  gate cases generate --suite v2 --rows 2000 --split eval --out /tmp/v2")
    gen.add_argument("--suite", default="classic", help="the suite to generate: classic or v2")
    gen.add_argument("--out", default=None, help="folder to write eval_curated.jsonl and train_procedural.jsonl "
                                                 "into (default: cases/SUITE)")
    gen.add_argument("--rows", type=rows_arg, default=None, help="rows per batch (suite v2 only; default 20)")
    gen.add_argument("--split", choices=("both", "eval", "train"), default="both", help="which file(s) to write")
    gen.set_defaults(fn=cmd_cases_generate)

    rep = sub.add_parser("report", help="grade agents on a case file and print the tables",
                         description="Play every case with every agent and print the report tables.",
                         epilog=agents_epilog(["gate report", "gate report --agents naive,careful --json",
                                               "gate report --cases cases/classic/train_procedural.jsonl",
                                               "PYTHONPATH=examples gate report --agents my_agent:AmountCheck"]))
    rep.add_argument("--cases", default=None, help=CASES_HELP)
    rep.add_argument("--agents", default=None, help="comma-separated agent names (default: naive,careful,refuse-all;"
                                                    " with --reward dense or potential: careful-sql,careful,naive,"
                                                    "random)")
    rep.add_argument("--json", action="store_true", help="print every grade as JSON instead of the tables")
    rep.add_argument("--reward", choices=REWARD_CHOICES, default="terminal",
                     help="terminal: the rubric; dense, potential: shaped step rewards too (default: terminal)")
    rep.add_argument("--seed", type=int, default=0, help="seed of the random policy (dense report)")
    rep.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    rep.add_argument("--workers", type=workers_arg, default=None, help=WORKERS_HELP)
    rep.set_defaults(fn=cmd_report)

    att = sub.add_parser("attacks", help="run the attackers against the grader",
                         description="Agents that try to score without doing the job, next to careful.",
                         epilog=agents_epilog(["gate attacks", "gate attacks --agents careful,report-liar --json"]))
    att.add_argument("--cases", default=None, help=CASES_HELP)
    att.add_argument("--agents", default=None, help="comma-separated agent names (default: careful, every "
                                                    "attacker, profile-only)")
    att.add_argument("--json", action="store_true", help="print every grade as JSON instead of the table")
    att.add_argument("--workers", type=workers_arg, default=None, help=WORKERS_HELP)
    att.set_defaults(fn=cmd_attacks)

    rp = sub.add_parser("replay", help="apply recorded tool calls to fresh episodes",
                        description="Replay trajectories (JSON lines: {\"case_id\": ..., \"actions\": [{\"tool\": ...,"
                                    " \"args\": {...}}, ...]}; docs/task.md) and grade them.",
                        epilog="example:\n  gate replay --trajectories my_trajectories.jsonl --reward dense --json")
    rp.add_argument("--cases", default=None, help=CASES_HELP)
    rp.add_argument("--trajectories", required=True, metavar="FILE", help="the trajectories file (JSON lines)")
    rp.add_argument("--json", action="store_true", help="print each episode's results, ledger and grade as JSON")
    rp.add_argument("--reward", choices=REWARD_CHOICES, default="terminal",
                    help="add each call's reward under this mode and their sum (default: terminal)")
    rp.set_defaults(fn=cmd_replay)

    import importlib
    for mod in EXTENSIONS:
        importlib.import_module(f"{__package__}.{mod}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        reached = parser.reached([n for n in (getattr(args, "command", None), getattr(args, "cases_command", None))
                                  if n])
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}; {reached.prog} takes "
                             f"{', '.join(reached.options) or 'no options'}")
        if not hasattr(args, "fn"):  # `gate` or `gate cases` alone: what there is to run
            reached.print_help()
            return 0
        return args.fn(args)
    except (UsageError, CaseError, ContractError, UnknownAgent, AgentOptionError, TrajectoryError) as exc:
        print(f"gate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped reading (`gate report | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not complain
        return 0


if __name__ == "__main__":
    sys.exit(main())
