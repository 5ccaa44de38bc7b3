"""`gate attacks`: the suite's attackers, agents that try to score without doing the job, next to its target."""
from __future__ import annotations

from ..kernel.settings import Settings
from .common import (
    CASES_HELP,
    WORKERS_HELP,
    agent_list,
    agents_epilog,
    cases_arg,
    grades_json,
    grades_of,
    play_with_progress,
    resolve_agents,
    workers_arg,
)


def cmd_attacks(a, settings: Settings) -> int:
    from ..kernel.cases import read_cases, suite_of_cases
    cases = read_cases(cases_arg(a, settings))
    suite = suite_of_cases(cases)
    grades = grades_of(play_with_progress(
        cases, resolve_agents(agent_list(a.agents, list(suite.attack_agents)), settings),
        workers=a.workers, show=not a.json))
    if a.json:
        print(grades_json(grades))
    else:
        from ..tables import attacker_table
        print(attacker_table(grades, target=suite.target))
    return 0


def register(subparsers) -> None:
    att = subparsers.add_parser("attacks", help="run the attackers against the grader",
                                description="Agents that try to score without doing the job, next to careful.",
                                epilog=agents_epilog(["gate attacks", "gate attacks --agents careful,report-liar --json"]))
    att.add_argument("--cases", default=None, help=CASES_HELP)
    att.add_argument("--agents", default=None, help="comma-separated agent names (default: the suite's target, "
                                                    "every attacker of the suite, profile-only for the classic)")
    att.add_argument("--json", action="store_true", help="print every grade as JSON instead of the table")
    att.add_argument("--workers", type=workers_arg, default=None, help=WORKERS_HELP)
    att.set_defaults(fn=cmd_attacks)
