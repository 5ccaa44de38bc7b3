"""Contract-schema experiments: the careful baseline under each variant, side by side.

Each case is prepared once and played by `careful@<variant>` for every variant, so a table
row differs from the `full` row only by what the variant changed in the schema. Per variant:
the mean reward, defective batches loaded, clean batches refused (quarantined), revenue
error, and the same per family; "let through" lists the families a bad batch got past in.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .kernel.agents import AgentSpec
from .kernel.cases import Case, suite_of_cases
from .kernel.engine import play_cases
from .kernel.grading import exact_mean
from .kernel.variants import Variant, careful_factory, load_variants, variant_agent_name, variants_of_suite
from .tables import family_order, money

LABEL = 40


def agent_name(variant: Variant) -> str:
    return variant_agent_name(variant)


def play_variants(cases: list[Case], variants: list[Variant], progress: Callable | None = None,
                  workers: int = 1) -> dict:
    """{agent name: [Grade per case]} of careful under each variant."""
    specs = [AgentSpec(agent_name(v), {}, careful_factory(v), agent_name(v)) for v in variants]
    results = play_cases(cases, specs, progress=progress, workers=workers)
    return {name: [r.grade for r in rs] for name, rs in results.items()}


def _figures(gs: list) -> dict:
    return {"reward": float(exact_mean(g.reward for g in gs)),
            "bad_batches_loaded": sum(g.bad_batches_loaded for g in gs),
            "clean_batches_refused": sum(g.clean_batches_refused for g in gs),
            "revenue_error_usd": float(money(g.revenue_error_usd for g in gs))}


def families_of(cases: list[Case]) -> list[str]:
    return family_order(c.family for c in cases)


def summarise(cases: list[Case], variants: list[Variant], grades: dict) -> dict:
    """The experiment's figures (JSON-ready): totals and per-family figures per variant."""
    families = families_of(cases)
    defective = sum(1 for c in cases for b in c.batches if b.defective)
    total = sum(len(c.batches) for c in cases)
    out = {"cases": len(cases), "batches": total, "defective": defective, "clean": total - defective,
           "families": families, "variants": {}}
    for v in variants:
        gs = grades[agent_name(v)]
        per_family = {f: _figures([g for g in gs if g.family == f]) for f in families}
        out["variants"][v.name] = {
            "agent": agent_name(v), "description": v.description,
            "remove_rules": list(v.remove_rules), "overrides": v.overrides,
            **_figures(gs), "per_family": per_family,
            "let_through": [f for f in families if per_family[f]["bad_batches_loaded"]],
            "refused_clean_in": [f for f in families if per_family[f]["clean_batches_refused"]],
        }
    return out


def run_experiment(cases: list[Case], variants: list[Variant] | None = None,
                   progress: Callable | None = None, contracts: str | Path | None = None,
                   workers: int = 1) -> tuple[dict, dict]:
    """(summary, grades) of careful under each variant (default: every variant file in `contracts` whose
    base is of the cases' suite: careful-v2's variants for suite v2 cases)."""
    if variants is None:
        variants = variants_of_suite(suite_of_cases(cases), load_variants(None, contracts))
    grades = play_variants(cases, variants, progress, workers)
    return summarise(cases, variants, grades), grades


def _head(family: str) -> tuple[str, str]:
    first, _, rest = family.partition("-")
    return first, rest


def _agent_of(variants: dict) -> str:
    """The agent the variants apply to (their suite's careful agent), or the agents, when they mix suites."""
    return " and ".join(dict.fromkeys(v["agent"].partition("@")[0] for v in variants.values()))


def experiment_tables(summary: dict, split: str = "eval") -> str:
    """The experiment as text: one row per variant, then mean reward per family."""
    s, V = summary, summary["variants"]
    label = max([LABEL] + [len(name) + 2 for name in V])  # the classic 40, wider for longer variant names
    fams = s["families"]
    col = max([10] + [len(part) + 1 for f in fams for part in _head(f)])
    lines = [f"{split} split: {s['cases']} cases, {s['batches']} batches ({s['defective']} defective, "
             f"{s['clean']} clean); {_agent_of(V)} under each contract-schema variant", "",
             f"{'variant':<{label}}{'reward':>8}{'bad loaded':>12}{'clean refused':>15}{'revenue err $':>15}"
             f"  let through"]
    for name, v in V.items():
        bad, refused = f"{v['bad_batches_loaded']}/{s['defective']}", f"{v['clean_batches_refused']}/{s['clean']}"
        lines.append(f"{name:<{label}}{v['reward']:>8.4f}{bad:>12}{refused:>15}{v['revenue_error_usd']:>15,.2f}"
                     f"  {', '.join(v['let_through']) or '-'}")
    lines += ["", "per family (mean reward):",
              f"{'':<{label}}" + "".join(f"{_head(f)[0]:>{col}}" for f in fams),
              f"{'':<{label}}" + "".join(f"{_head(f)[1]:>{col}}" for f in fams)]
    for name, v in V.items():
        lines.append(f"{name:<{label}}" + "".join(f"{v['per_family'][f]['reward']:>{col}.4f}" for f in fams))
    return "\n".join(lines)
