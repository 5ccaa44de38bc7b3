"""`gate experiment`: the careful baseline under contract-schema variants, tabulated.

    gate experiment [--cases F] [--variants a,b] [--json] [--html FILE]
"""
from __future__ import annotations

import json

from ..cases import read_cases, split_of, suite_of_cases
from ..settings import Settings
from .errors import UsageError
from .html_output import html_target, save_html
from .common import cases_arg, workers_arg, workers_for
from .progress import progress_bar


def _variant_names(text: str | None, settings: Settings) -> list[str] | None:
    from ..variants import variant_names, variants_dir
    folder = variants_dir(settings.contracts_dir)
    if not folder.is_dir():
        raise UsageError(f"no variants directory {folder} (GATE_CONTRACTS={settings.contracts_dir})")
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--variants needs at least one variant name")
    known = variant_names(settings.contracts_dir)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown variant {unknown[0]!r}; variants: {', '.join(known)}")
    return names


def cmd_experiment(a) -> int:
    from ..experiments import experiment_tables, run_experiment
    from ..variants import load_variants, variants_of_suite
    target = html_target(a.html)
    settings = Settings.from_env()
    path = cases_arg(a, settings)
    cases = read_cases(path)
    variants = load_variants(_variant_names(a.variants, settings), settings.contracts_dir)  # all checked first
    suite = suite_of_cases(cases)
    if a.variants is None:  # every variant of the case file's suite
        variants = variants_of_suite(suite, variants)
    else:
        wrong = [v for v in variants if v.suite != suite]
        if wrong:
            raise UsageError(f"variant {wrong[0].name!r} has base {wrong[0].base!r}; {path} holds {suite} cases")
    if not variants:
        raise UsageError(f"no variant files for the {suite} suite in {settings.contracts_dir / 'variants'}")
    with progress_bar(len(cases), "cases") as advance:
        summary, grades = run_experiment(cases, variants, progress=advance, contracts=settings.contracts_dir,
                                         workers=workers_for(a.workers, len(cases) * len(variants)))
    text = experiment_tables(summary, split=split_of(path))
    if a.json:
        print(json.dumps({"experiment": summary,
                          "agents": {name: [g.as_dict() for g in gs] for name, gs in grades.items()}}))
    else:
        print(text)
    if target is not None:
        save_html(target, grades, title="gate experiment: contract-schema variants",
                  subtitle=f"careful under {len(summary['variants'])} variants of its pandera schema, "
                           f"{summary['cases']} cases ({path})",
                  tables=[("Variants", text)])
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("experiment", help="run careful under contract-schema variants (contracts/variants/)")
    p.add_argument("--cases", default=None, help="case file (default: the classic eval split)")
    p.add_argument("--variants", default=None, help="comma-separated variant names (default: every variant file)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    p.add_argument("--workers", type=workers_arg, default=None,
                   help="processes to play in (default: one per CPU from 64 episodes on, else 1)")
    p.set_defaults(fn=cmd_experiment)
