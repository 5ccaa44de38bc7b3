"""`gate`: generate cases, report baselines, run attackers, replay trajectories.

Every error a user can cause (a bad flag, a missing or malformed file, an unknown agent)
ends in one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..agents import AGENTS, ATTACKERS, UnknownAgent
from ..cases import CaseError, read_cases, split_of
from ..contract import ContractError
from .errors import UsageError
from .progress import progress_bar

# Subcommands that live in their own modules: each has register(subparsers, parser_class).
EXTENSIONS: tuple[str, ...] = ("experiment", "nightly", "run")

DEFAULT_CASES = Path("cases/classic/eval_curated.jsonl")
REPORT_AGENTS = ["naive", "careful", "refuse-all"]
ATTACK_AGENTS = ["careful", *ATTACKERS, "profile-only"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(message)


def _agents(text: str) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise UsageError("--agents needs at least one agent name")
    unknown = [a for a in names if a not in AGENTS and "@" not in a]  # careful@<variant>: make_agent checks
    if unknown:
        raise UsageError(f"unknown agent {unknown[0]!r}; agents: {', '.join(AGENTS)}")
    return names


def _cases(path) -> list[dict]:
    return read_cases(path)


def _play(cases, names):
    from ..runner import play_agents
    with progress_bar(len(cases), "episodes") as advance:
        return play_agents(cases, names, progress=advance)


def cmd_cases_generate(a) -> int:
    from ..generator import generate_suite
    try:
        paths = generate_suite(a.suite, a.out)
    except ValueError as exc:
        if isinstance(exc, ContractError):
            raise
        raise UsageError(str(exc))
    for p in paths:
        print(p)
    return 0


def cmd_report(a) -> int:
    from .html_output import html_target, save_html
    if a.html and a.reward == "dense":
        raise UsageError("--html draws the terminal-reward report; drop --reward dense")
    target = html_target(a.html)
    cases = _cases(a.cases)
    names = _agents(a.agents) if a.agents else REPORT_AGENTS
    if a.reward == "dense":
        from .dense import dense_report
        return dense_report(a, cases)
    grades = _play(cases, names)
    from ..tables import baseline_tables
    tables = baseline_tables(cases, grades, split=split_of(a.cases))
    if a.json:
        print(json.dumps({"agents": grades}))
    else:
        print(tables)
    if target is not None:
        save_html(target, grades, title="gate report", subtitle=f"{len(cases)} cases ({a.cases})",
                  tables=[("Tables", tables)])
    return 0


def cmd_attacks(a) -> int:
    cases = _cases(a.cases)
    names = _agents(a.agents) if a.agents else ATTACK_AGENTS
    grades = _play(cases, names)
    if a.json:
        print(json.dumps({"agents": grades}))
    else:
        from ..tables import attacker_table
        print(attacker_table(grades))
    return 0


def cmd_replay(a) -> int:
    from ..runner import replay
    from ..world import PreparedCase
    cases = {c["case_id"]: c for c in _cases(a.cases)}
    prepared: dict[str, PreparedCase] = {}
    try:
        lines = Path(a.trajectories).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"{a.trajectories}: cannot read trajectories ({exc.strerror or exc})")
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            t = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{a.trajectories}:{n}: not JSON ({exc.msg})")
        except RecursionError:
            raise UsageError(f"{a.trajectories}:{n}: not usable JSON (nested too deep)")
        if not isinstance(t, dict) or not isinstance(t.get("calls"), list) or "case_id" not in t:
            raise UsageError(f"{a.trajectories}:{n}: a trajectory needs 'case_id' and a list 'calls'")
        if t["case_id"] not in cases:
            raise UsageError(f"{a.trajectories}:{n}: no case {t['case_id']!r} in {a.cases}")
        items.append(t)
    dense = getattr(a, "reward", "terminal") == "dense"
    for t in items:
        cid = t["case_id"]
        if cid not in prepared:
            prepared[cid] = PreparedCase(cases[cid])
        if dense:
            from ..episode_api import replay_dense
            out = replay_dense(prepared[cid], t["calls"])
        else:
            out = replay(prepared[cid], t["calls"])
        if a.json:
            print(json.dumps(out))
        else:
            g = out["grade"]
            print(f"{cid:<28} reward {g['reward']:.4f}  calls {len(out['results'])}  "
                  f"ledger {'intact' if g['ledger_intact'] else 'BROKEN'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gate", description="gate: does a tool-using agent stop a bad batch before it becomes a wrong number?")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True

    cases = sub.add_parser("cases", help="case files")
    csub = cases.add_subparsers(dest="cases_command", parser_class=_Parser)
    csub.required = True
    gen = csub.add_parser("generate", help="write a suite's case files")
    gen.add_argument("--suite", default="classic")
    gen.add_argument("--out", default="cases/classic")
    gen.set_defaults(fn=cmd_cases_generate)

    rep = sub.add_parser("report", help="grade agents on a case file and print the tables")
    rep.add_argument("--cases", default=str(DEFAULT_CASES))
    rep.add_argument("--agents", default=None, help="comma-separated agent names (default: naive,careful,refuse-all)")
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--reward", choices=["terminal", "dense"], default="terminal")
    rep.add_argument("--seed", type=int, default=0, help="seed of the random policy (dense report)")
    rep.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    rep.set_defaults(fn=cmd_report)

    att = sub.add_parser("attacks", help="run the attackers against the grader")
    att.add_argument("--cases", default=str(DEFAULT_CASES))
    att.add_argument("--agents", default=None)
    att.add_argument("--json", action="store_true")
    att.set_defaults(fn=cmd_attacks)

    rp = sub.add_parser("replay", help="apply recorded tool calls to fresh episodes")
    rp.add_argument("--cases", default=str(DEFAULT_CASES))
    rp.add_argument("--trajectories", required=True)
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--reward", choices=["terminal", "dense"], default="terminal")
    rp.set_defaults(fn=cmd_replay)

    import importlib
    for mod in EXTENSIONS:
        importlib.import_module(f"{__package__}.{mod}").register(sub, _Parser)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except (UsageError, CaseError, ContractError, UnknownAgent) as exc:
        print(f"gate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
