"""`gate experiment`: the careful baseline under contract-schema variants, tabulated.

    gate experiment [--cases F] [--variants a,b] [--json] [--html FILE]
"""
from __future__ import annotations

import json

from ..kernel.cases import read_cases, split_of, suite_of_cases
from ..kernel.settings import Settings
from .common import (
    CASES_HELP,
    WORKERS_HELP,
    cases_arg,
    workers_arg,
    workers_for,
)
from .errors import UsageError
from .html_output import html_target, save_html
from .progress import progress_bar


def _variant_names(text: str | None, settings: Settings) -> list[str] | None:
    from ..kernel.variants import variants_dir
    folder = variants_dir(settings.contracts_dir)
    if not folder.is_dir():
        raise UsageError(f"no variants directory {folder} (GATE_CONTRACTS={settings.contracts_dir})")
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--variants needs at least one variant name")
    return names  # each loaded by its name, or said to be unknown (`load_variant`)


def cmd_experiment(a, settings: Settings) -> int:
    from ..experiments import experiment_tables, run_experiment
    from ..kernel.variants import load_variants, variants_of_suite
    target = html_target(a.html)
    path = cases_arg(a, settings)
    cases = read_cases(path)
    variants = load_variants(_variant_names(a.variants, settings), settings.contracts_dir)  # all checked first
    suite = suite_of_cases(cases)
    if a.variants is None:  # every variant of the case file's suite
        variants = variants_of_suite(suite, variants)
    else:
        wrong = [v for v in variants if v.suite is not suite]
        if wrong:
            raise UsageError(f"variant {wrong[0].name!r} has base {wrong[0].base!r}; {path} holds {suite.name} cases")
    if not variants:
        raise UsageError(f"no variant files for the {suite.name} suite in {settings.contracts_dir / 'variants'}")
    with progress_bar(len(cases), "cases", enabled=not a.json) as advance:
        summary, grades = run_experiment(cases, variants, progress=advance, contracts=settings.contracts_dir,
                                         workers=workers_for(a.workers, len(cases) * len(variants)))
    text = experiment_tables(summary, split=split_of(path))
    save_html(target, grades, title="gate experiment: contract-schema variants",
              subtitle=f"careful under {len(summary['variants'])} variants of its pandera schema, "
                       f"{summary['cases']} cases ({path})",
              tables=[("Variants", text)])  # first: a closed stdout must not lose the page
    if a.json:
        print(json.dumps({"experiment": summary,
                          "agents": {name: [g.as_dict() for g in gs] for name, gs in grades.items()}}))
    else:
        print(text)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("experiment", help="run careful under contract-schema variants (contracts/variants/)",
                              description="careful, with its pandera schema built from each variant of the "
                                          "contract, on every case; what each rule is worth.",
                              epilog="examples:\n  gate experiment\n  gate experiment --variants full,no-orders.amount.out_of_range --json")
    p.add_argument("--cases", default=None, help=CASES_HELP)
    p.add_argument("--variants", default=None, help="comma-separated variant names (default: every variant file "
                                                    "in $GATE_CONTRACTS/variants)")
    p.add_argument("--json", action="store_true", help="print the figures and every grade as JSON")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument("--workers", type=workers_arg, default=None, help=WORKERS_HELP)
    p.set_defaults(fn=cmd_experiment)
