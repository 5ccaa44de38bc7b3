"""pass@1 and pass^k per family, from rollout records: a rollout passes when its reward is 1.0.

pass@1 is the mean share of a case's k rollouts that pass; pass^k is the share of cases where
all k pass (the reliability measure: a model that passes half the time has pass@1 0.5 but
pass^3 near 0.125). Means are exact fractions, so the figures never move by a digit.
"""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from ..kernel.suite import family_order

PASS = 1.0


def pass_rates(records: list[dict], k: int) -> dict:
    """{family: {"cases", "pass@1", "pass^k"}} plus "all"; a case counts only with all k rollouts present."""
    by_case: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if 0 <= r["rollout"] < k:
            by_case[r["case_id"]].append(r)
    groups: dict[str, list[list[dict]]] = defaultdict(list)
    for rs in by_case.values():
        if len(rs) == k:
            groups[rs[0]["family"]].append(rs)
    out = {}
    for family in family_order(groups) + ["all"]:
        cases = [rs for f in groups for rs in groups[f]] if family == "all" else groups[family]
        if not cases:
            continue
        passes = [sum(1 for r in rs if r["reward"] == PASS) for rs in cases]
        out[family] = {"cases": len(cases),
                       "pass@1": float(sum((Fraction(p, k) for p in passes), Fraction(0)) / len(cases)),
                       f"pass^{k}": float(Fraction(sum(1 for p in passes if p == k), len(cases)))}
    return out


def pass_table(records: list[dict], k: int) -> str:
    rates = pass_rates(records, k)
    lines = [f"pass@1 and pass^{k} per family (a rollout passes at reward 1.0):",
             f"{'':<22}{'cases':>8}{'pass@1':>10}{f'pass^{k}':>10}"]
    for family, row in rates.items():
        lines.append(f"{family:<22}{row['cases']:>8}{row['pass@1']:>10.4f}{row[f'pass^{k}']:>10.4f}")
    return "\n".join(lines)
