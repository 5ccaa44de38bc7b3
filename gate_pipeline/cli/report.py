"""`gate report`: grade agents on a case file and print the tables (or every grade as JSON)."""
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
    int_arg,
    play_with_progress,
    resolve_agents,
    workers_arg,
)
from .errors import UsageError

REWARD_CHOICES = ("terminal", "dense", "potential")  # rewards.REWARD_MODES, without importing it here


def cmd_report(a, settings: Settings) -> int:
    from ..kernel.cases import CaseLines, split_of
    from ..kernel.suite import suites
    from .html_output import html_target, save_html
    if a.html and a.reward != "terminal":
        raise UsageError(f"--html draws the terminal-reward report; drop --reward {a.reward}")
    target = html_target(a.html)
    path = cases_arg(a, settings)
    lines = CaseLines.read(path)
    if a.reward != "terminal":
        from .dense import DENSE_AGENTS, dense_report
        names = agent_list(a.agents, list(DENSE_AGENTS))
        specs = resolve_agents(names, settings, {"random": {"seed": a.seed}} if "random" in names else {})
        return dense_report(a, lines.cases(), specs, path)
    default = list(suites.get(lines.first().suite).report_agents) if a.agents is None else []
    specs = resolve_agents(agent_list(a.agents, default), settings)
    tabled = target is not None or not a.json
    # the tables need every case here; a JSON report does not, and its workers each parse their share of the lines
    cases = lines.cases() if tabled else lines
    grades = grades_of(play_with_progress(cases, specs, workers=a.workers, show=not a.json))
    from ..tables import baseline_tables
    tables = baseline_tables(cases, grades, split=split_of(path)) if tabled else ""
    save_html(target, grades, title="gate report", subtitle=f"{len(cases)} cases ({path})",
              tables=[("Tables", tables)])  # first: a closed stdout must not lose the page
    print(grades_json(grades) if a.json else tables)
    return 0


def register(subparsers) -> None:
    rep = subparsers.add_parser("report", help="grade agents on a case file and print the tables",
                                description="Play every case with every agent and print the report tables.",
                                epilog=agents_epilog(["gate report", "gate report --agents naive,careful --json",
                                                      "gate report --cases cases/classic/train_procedural.jsonl",
                                                      "PYTHONPATH=examples gate report --agents my_agent:AmountCheck"]))
    rep.add_argument("--cases", default=None, help=CASES_HELP)
    rep.add_argument("--agents", default=None, help="comma-separated agent names (default: the case file's suite's "
                                                    "baselines, naive,careful,refuse-all for the classic suite;"
                                                    " with --reward dense or potential: careful-sql,careful,naive,"
                                                    "random)")
    rep.add_argument("--json", action="store_true", help="print every grade as JSON instead of the tables")
    rep.add_argument("--reward", choices=REWARD_CHOICES, default="terminal",
                     help="terminal: the rubric; dense, potential: shaped step rewards too (default: terminal)")
    rep.add_argument("--seed", type=int_arg("--seed", -(2**63), 2**63 - 1), default=0, help="seed of the random policy (dense report)")
    rep.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    rep.add_argument("--workers", type=workers_arg, default=None, help=WORKERS_HELP)
    rep.set_defaults(fn=cmd_report)
