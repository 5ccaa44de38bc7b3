"""The report tables, as text: baselines, per family, ablation, largest naive errors, attackers.

Means are exact (fractions of each value's %.9f form) and money is summed from cents, so a
table never moves by a digit between machines or Python versions.
"""
from __future__ import annotations

from decimal import Decimal

from .kernel.cases import Case
from .kernel.grading import exact_mean
from .kernel.records import TERMS, WEIGHTS
from .kernel.suite import family_order, suites

LABEL, COL = 22, 14
__all__ = ["family_order", "money", "summary", "baseline_tables", "attacker_table"]


def _f4(x) -> str:
    return f"{float(x):.4f}"


def money(values) -> Decimal:
    return sum((Decimal("%.2f" % v) for v in values), Decimal(0))


def _row(label: str, cells, width=COL) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{c:>{width}}" for c in cells)


def _width(names) -> int:
    """Column width: the classic 14, wider when an agent name (e.g. careful@no-...) needs it."""
    return max([COL] + [len(n) + 2 for n in names])


def _metrics(gs: list) -> tuple:
    """The suite metrics the grades carry (the suite of their first grade's, when every grade has them)."""
    names = {g.suite for g in gs}
    if len(names) != 1 or "" in names or next(iter(names)) not in suites.names():
        return ()
    return tuple(m for m in suites.get(next(iter(names))).metrics if all(m.key in g.metrics for g in gs))


def summary(cases: list[Case], grades: dict[str, list]) -> dict:
    """The figures behind the tables, per agent (JSON-ready); `grades` is {agent: [Grade per case]}."""
    n_batches = sum(len(c.batches) for c in cases)
    n_bad = sum(1 for c in cases for b in c.batches if b.defective)
    out = {"cases": len(cases), "batches": n_batches, "defective": n_bad, "agents": {}}
    families = family_order(c.family for c in cases)
    for name, gs in grades.items():
        fam = {f: float(exact_mean(g.reward for g in gs if g.family == f)) for f in families
               if any(g.family == f for g in gs)}
        ablation = {"full": float(exact_mean(g.reward for g in gs))}
        for term in TERMS:
            ablation[f"no {term}"] = float(exact_mean(
                round(sum(WEIGHTS[t] * getattr(g, t) for t in TERMS if t != term), 6) for g in gs))
        out["agents"][name] = {
            "reward": float(exact_mean(g.reward for g in gs)),
            **{t: float(exact_mean(getattr(g, t) for g in gs)) for t in TERMS},
            "report_matches": sum(1 for g in gs if g.report == 1.0),
            "bad_batches_loaded": sum(g.bad_batches_loaded for g in gs),
            "revenue_error_usd": float(money(g.revenue_error_usd for g in gs)),
            "ledgers_intact": sum(1 for g in gs if g.ledger_intact),
            "finished": sum(1 for g in gs if g.finished),
            "failed": sum(1 for g in gs if g.failed),
            "per_family": fam, "ablation": ablation,
        }
        for m in _metrics(gs):  # the suite's own figures (suite v2: rows graded one by one, question costs)
            values = [g.metrics[m.key] for g in gs]
            out["agents"][name][m.key] = float(exact_mean(values)) if m.total == "mean" else sum(values)
    return out


def _suite_metrics(grades: dict[str, list]) -> tuple:
    """The metrics every agent's grades carry (those of one suite)."""
    found = [_metrics(gs) for gs in grades.values()]
    return found[0] if found and all(f == found[0] for f in found) else ()


def _cell(metric, value) -> str:
    return _f4(value) if metric.total == "mean" else f"{value:,}"


def baseline_tables(cases: list[Case], grades: dict[str, list], split: str = "eval", figures: dict | None = None) -> str:
    """The report tables; `figures`, when given, is `summary(cases, grades)` already made (not made again)."""
    s = figures if figures is not None else summary(cases, grades)
    names = list(grades)
    w = _width(names)
    A = s["agents"]
    n = s["cases"]
    lines = [f"{split} split: {n} cases, {s['batches']} batches, {s['defective']} defective", "",
             _row("", names, w),
             _row("reward (mean)", [_f4(A[a]["reward"]) for a in names], w),
             _row("disposition (mean)", [_f4(A[a]["disposition"]) for a in names], w),
             _row("report matches", [f"{A[a]['report_matches']}/{n}" for a in names], w),
             _row("defective loaded", [f"{A[a]['bad_batches_loaded']}/{s['defective']}" for a in names], w),
             _row("revenue error $", [f"{A[a]['revenue_error_usd']:,.2f}" for a in names], w),
             _row("ledgers intact", [f"{A[a]['ledgers_intact']}/{n}" for a in names], w)]
    if any(A[a]["failed"] for a in names):  # only then: a table of agents that never fail stays as it was
        lines.append(_row("failed episodes", [f"{A[a]['failed']}/{n}" for a in names], w))
    for m in _suite_metrics(grades):  # the suite's own figures
        lines.append(_row(m.label, [_cell(m, A[a][m.key]) for a in names], w))
    lines += ["", "per family (mean reward):", _row("", names, w)]
    for fam in A[names[0]]["per_family"]:
        lines.append(_row(fam, [_f4(A[a]["per_family"].get(fam, 0)) for a in names], w))
    lines += ["", "ablation (mean reward with one term removed, weights not renormalised):", _row("", names, w)]
    for key in A[names[0]]["ablation"]:
        lines.append(_row(key, [_f4(A[a]["ablation"][key]) for a in names], w))
    if "naive" in grades:
        lines += ["", "largest naive revenue errors (mart after naive vs mart if handled correctly):"]
        worst = sorted(grades["naive"], key=lambda g: -g.revenue_error_usd)[:3]
        for g in worst:
            lines.append(f"  {g.case_id:<26} naive $ {g.revenue:>11,.2f}   "
                         f"correct $ {g.correct_revenue:>11,.2f}")
    return "\n".join(lines + failures(grades))


def attacker_table(grades: dict[str, list], target: str = "careful") -> str:
    s = summary([], grades)["agents"]
    lab = max([23] + [len(f"{n} (target)" if n == target else n) + 3 for n in grades])
    head = (f"{'agent':<{lab}}{'reward':>8}{'disp':>8}{'report':>8}{'evid':>8}{'insp':>8}"
            f"{'bad loaded':>12}{'revenue err $':>16}")
    metrics = _suite_metrics(grades)
    for m in metrics:  # the suite's own figures
        head += f"{_short(m):>{_short_width(m)}}"
    lines = [head]
    for name, a in s.items():
        label = f"{name} (target)" if name == target else name
        line = (f"{label:<{lab}}{_f4(a['reward']):>8}{_f4(a['disposition']):>8}{_f4(a['report']):>8}"
                f"{_f4(a['evidence']):>8}{_f4(a['inspected']):>8}{a['bad_batches_loaded']:>12}"
                f"{a['revenue_error_usd']:>16,.2f}")
        for m in metrics:
            line += f"{_cell(m, a[m.key]):>{_short_width(m)}}"
        lines.append(line)
    return "\n".join(lines + failures(grades))


REASON_CHARS = 120


def failures(grades: dict[str, list]) -> list[str]:
    """The failed episodes, counted apart (each is graded 0 on every term): per agent and reason, how many
    and in which families. Nothing when no episode failed."""
    lines: list[str] = []
    for name, gs in grades.items():
        by_reason: dict[str, list] = {}
        for g in gs:
            if g.failed:
                by_reason.setdefault(g.reason or "(no reason given)", []).append(g)
        for reason, failed in by_reason.items():
            families = family_order(g.family for g in failed)
            counts = ", ".join(f"{f} {sum(1 for g in failed if g.family == f)}" for f in families)
            shown = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "..."
            lines.append(f"  {name}: {len(failed)} of {len(gs)} ({counts}): {shown}")
    if lines:
        lines = ["", "failed episodes (each graded 0 on every term, counted in the means above):", *lines]
    return lines



def _short(metric) -> str:
    """A metric's column head in the attacker table."""
    return metric.short or metric.key.replace("_", " ")


def _short_width(metric) -> int:
    return max(8, len(_short(metric)) + 2)
