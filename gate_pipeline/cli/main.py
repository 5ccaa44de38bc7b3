"""`gate`: generate cases, report baselines, run attackers, replay trajectories.

Every command is a thin caller of the one engine (`gate_pipeline.engine`). Every error a user
can cause (a bad flag, a missing or malformed file, an unknown agent) ends in one line on
stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..actions import TrajectoryError
from ..agents import ATTACKERS, V2_ATTACKERS, AgentOptionError, UnknownAgent
from ..cases import CaseError, read_cases, split_of, suite_of_cases
from ..contract import ContractError
from ..settings import Settings
from .common import (Parser, agent_list, cases_arg, grades_json, grades_of, play_with_progress, resolve_agents,
                     workers_arg)
from .errors import UsageError

# Subcommands that live in their own modules: each has register(subparsers).
EXTENSIONS: tuple[str, ...] = ("experiment", "nightly", "run", "verify")

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
    settings = Settings.from_env()
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
    settings = Settings.from_env()
    path = cases_arg(a, settings)
    cases = read_cases(path)
    if a.reward != "terminal":
        from .dense import DENSE_AGENTS, dense_report
        specs = resolve_agents(agent_list(a.agents, list(DENSE_AGENTS)), settings, {"random": {"seed": a.seed}})
        return dense_report(a, cases, specs, path)
    specs = resolve_agents(agent_list(a.agents, report_agents(cases)), settings)
    grades = grades_of(play_with_progress(cases, specs, workers=a.workers))
    from ..tables import baseline_tables
    tables = baseline_tables(cases, grades, split=split_of(path)) if target is not None or not a.json else ""
    print(grades_json(grades) if a.json else tables)
    if target is not None:
        save_html(target, grades, title="gate report", subtitle=f"{len(cases)} cases ({path})",
                  tables=[("Tables", tables)])
    return 0


def cmd_attacks(a) -> int:
    settings = Settings.from_env()
    cases = read_cases(cases_arg(a, settings))
    v2 = suite_of_cases(cases) == "v2"
    grades = grades_of(play_with_progress(
        cases, resolve_agents(agent_list(a.agents, V2_ATTACK_AGENTS if v2 else ATTACK_AGENTS), settings),
        workers=a.workers))
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
    settings = Settings.from_env()
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
    p = Parser(prog="gate", description="gate: does a tool-using agent stop a bad batch before it becomes a wrong number?")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    sub.required = True

    cases = sub.add_parser("cases", help="case files")
    csub = cases.add_subparsers(dest="cases_command", parser_class=Parser)
    csub.required = True
    gen = csub.add_parser("generate", help="write a suite's case files")
    gen.add_argument("--suite", default="classic")
    gen.add_argument("--out", default=None)
    gen.add_argument("--rows", type=rows_arg, default=None, help="rows per batch (suite v2 only; default 20)")
    gen.add_argument("--split", choices=("both", "eval", "train"), default="both", help="which file(s) to write")
    gen.set_defaults(fn=cmd_cases_generate)

    rep = sub.add_parser("report", help="grade agents on a case file and print the tables")
    rep.add_argument("--cases", default=None, help="case file (default: the classic eval split)")
    rep.add_argument("--agents", default=None, help="comma-separated agent names (default: naive,careful,refuse-all)")
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--reward", choices=REWARD_CHOICES, default="terminal",
                     help="terminal: the rubric; dense, potential: shaped step rewards too (default: terminal)")
    rep.add_argument("--seed", type=int, default=0, help="seed of the random policy (dense report)")
    rep.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    rep.add_argument("--workers", type=workers_arg, default=None,
                     help="processes to play in (default: one per CPU from 64 episodes on, else 1)")
    rep.set_defaults(fn=cmd_report)

    att = sub.add_parser("attacks", help="run the attackers against the grader")
    att.add_argument("--cases", default=None, help="case file (default: the classic eval split)")
    att.add_argument("--agents", default=None)
    att.add_argument("--json", action="store_true")
    att.add_argument("--workers", type=workers_arg, default=None,
                     help="processes to play in (default: one per CPU from 64 episodes on, else 1)")
    att.set_defaults(fn=cmd_attacks)

    rp = sub.add_parser("replay", help="apply recorded tool calls to fresh episodes")
    rp.add_argument("--cases", default=None, help="case file (default: the classic eval split)")
    rp.add_argument("--trajectories", required=True)
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--reward", choices=REWARD_CHOICES, default="terminal",
                    help="add each call's reward under this mode and their sum (default: terminal)")
    rp.set_defaults(fn=cmd_replay)

    import importlib
    for mod in EXTENSIONS:
        importlib.import_module(f"{__package__}.{mod}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except (UsageError, CaseError, ContractError, UnknownAgent, AgentOptionError, TrajectoryError) as exc:
        print(f"gate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
