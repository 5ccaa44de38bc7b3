"""`gate experiment`: the careful baseline under contract-schema variants, tabulated.

    gate experiment [--cases F] [--variants a,b] [--json] [--html FILE]
"""
from __future__ import annotations

import json
from pathlib import Path

from ..cases import read_cases
from .errors import UsageError
from .html_output import html_target, save_html
from .progress import progress_bar

DEFAULT_CASES = "cases/classic/eval_curated.jsonl"


def _variant_names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--variants needs at least one variant name")
    from ..variants import variant_names
    known = variant_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown variant {unknown[0]!r}; variants: {', '.join(known)}")
    return names


def cmd_experiment(a) -> int:
    from ..experiments import experiment_tables, run_experiment
    from ..variants import load_variants
    target = html_target(a.html)
    cases = read_cases(a.cases)
    names = _variant_names(a.variants)
    load_variants(names)  # every variant file checked before the first episode
    with progress_bar(len(cases), "cases") as advance:
        summary, grades = run_experiment(cases, names, progress=advance)
    from ..cases import split_of
    text = experiment_tables(summary, split=split_of(a.cases))
    if a.json:
        print(json.dumps({"experiment": summary, "agents": grades}))
    else:
        print(text)
    if target is not None:
        save_html(target, grades, title="gate experiment: contract-schema variants",
                  subtitle=f"careful under {len(summary['variants'])} variants of its pandera schema, "
                           f"{summary['cases']} cases ({a.cases})",
                  tables=[("Variants", text)])
    return 0


def register(subparsers, parser_class) -> None:
    p = subparsers.add_parser("experiment", help="run careful under contract-schema variants (contracts/variants/)")
    p.add_argument("--cases", default=DEFAULT_CASES)
    p.add_argument("--variants", default=None, help="comma-separated variant names (default: every variant file)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", default=None, metavar="FILE", help="also write a self-contained HTML report")
    p.set_defaults(fn=cmd_experiment)
