"""The report tables, as text: baselines, per family, ablation, largest naive errors, attackers.

Means are exact (fractions of each value's %.9f form) and money is summed from cents, so a
table never moves by a digit between machines or Python versions.
"""
from __future__ import annotations

from decimal import Decimal

from .generator import FAMILIES as CLASSIC_FAMILIES
from .grader import TERMS, WEIGHTS, exact_mean
from .suite_v2.generator import FAMILIES as V2_FAMILIES

LABEL, COL = 22, 14
FAMILIES = (*CLASSIC_FAMILIES, *V2_FAMILIES)  # every suite's families, in suite order


def family_order(families) -> list[str]:
    """Families in their suite's order (classic, then v2), any others after them alphabetically (for
    every table and chart)."""
    present = set(families)
    return [f for f in FAMILIES if f in present] + sorted(present - set(FAMILIES))


def _f4(x) -> str:
    return f"{float(x):.4f}"


def money(values) -> Decimal:
    return sum((Decimal("%.2f" % v) for v in values), Decimal(0))


def _row(label: str, cells, width=COL) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{c:>{width}}" for c in cells)


def _width(names) -> int:
    """Column width: the classic 14, wider when an agent name (e.g. careful@no-...) needs it."""
    return max([COL] + [len(n) + 2 for n in names])


def summary(cases: list[dict], grades: dict[str, list]) -> dict:
    """The figures behind the tables, per agent (JSON-ready); `grades` is {agent: [Grade per case]}."""
    n_batches = sum(len(c["batches"]) for c in cases)
    n_bad = sum(1 for c in cases for b in c["batches"] if b["truth"]["defective"])
    out = {"cases": len(cases), "batches": n_batches, "defective": n_bad, "agents": {}}
    families = family_order(c["family"] for c in cases)
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
            "per_family": fam, "ablation": ablation,
        }
        if any(g.suite == "v2" for g in gs):  # rows graded one by one, and what questions cost
            out["agents"][name].update(
                bad_rows_loaded=sum(g.bad_rows_loaded or 0 for g in gs),
                clean_rows_lost=sum(g.clean_rows_lost or 0 for g in gs),
                question_cost=float(exact_mean(g.question_cost for g in gs)))
    return out


def baseline_tables(cases: list[dict], grades: dict[str, list], split: str = "eval") -> str:
    s = summary(cases, grades)
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
    if all("question_cost" in A[a] for a in names):  # a v2 case file
        lines += [_row("bad rows loaded", [f"{A[a]['bad_rows_loaded']:,}" for a in names], w),
                  _row("clean rows lost", [f"{A[a]['clean_rows_lost']:,}" for a in names], w),
                  _row("question cost (mean)", [_f4(A[a]["question_cost"]) for a in names], w)]
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
    return "\n".join(lines)


def attacker_table(grades: dict[str, list], target: str = "careful") -> str:
    s = summary([], grades)["agents"]
    lab = max([23] + [len(f"{n} (target)" if n == target else n) + 3 for n in grades])
    head = (f"{'agent':<{lab}}{'reward':>8}{'disp':>8}{'report':>8}{'evid':>8}{'insp':>8}"
            f"{'bad loaded':>12}{'revenue err $':>16}")
    v2 = all("question_cost" in a for a in s.values())
    if v2:  # a v2 case file: what questions cost, and rows
        head += f"{'q cost':>8}{'bad rows':>10}{'clean lost':>12}"
    lines = [head]
    for name, a in s.items():
        label = f"{name} (target)" if name == target else name
        line = (f"{label:<{lab}}{_f4(a['reward']):>8}{_f4(a['disposition']):>8}{_f4(a['report']):>8}"
                f"{_f4(a['evidence']):>8}{_f4(a['inspected']):>8}{a['bad_batches_loaded']:>12}"
                f"{a['revenue_error_usd']:>16,.2f}")
        if v2:
            line += f"{_f4(a['question_cost']):>8}{a['bad_rows_loaded']:>10,}{a['clean_rows_lost']:>12,}"
        lines.append(line)
    return "\n".join(lines)
