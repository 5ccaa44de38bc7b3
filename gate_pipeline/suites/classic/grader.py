"""The classic rubric: whole batches, one citation each, exactly as the classic suite grades.

Per batch (CONFORMANCE §6): a defective batch is right when it was quarantined and never loaded, a
clean one when it was loaded exactly once and not before its customers; `evidence` credits the
first citation of each defective batch kept out when it names an accepted (column, defect type),
minus one per clean batch quarantined; `inspected` is the share of batches acted on that were
profiled, or read by a query, before the first action on them (the tables SQLite read).
"""
from __future__ import annotations

from ...kernel.cases import Case
from ...kernel.grading import Judgement, LedgerFold, Rubric


def disposition(truth: dict, loads: dict, quarantined: dict, orphans_at_load: dict) -> float:
    right = 0
    for bid, t in truth.items():
        if t["defective"]:
            right += loads.get(bid, 0) == 0 and bid in quarantined
        else:
            right += loads.get(bid, 0) == 1 and not orphans_at_load.get(bid)
    return right / len(truth)


def evidence(truth: dict, loads: dict, quarantined: dict) -> float:
    bad = [bid for bid, t in truth.items() if t["defective"]]
    if not bad:
        return 0.0 if quarantined else 1.0
    hits = 0
    for bid in bad:
        cite = quarantined.get(bid)
        if cite is None or loads.get(bid):
            continue
        accepted = truth[bid].get("accepted") or truth[bid]["defects"]
        hits += any(cite["column"] == a["column"] and cite["defect_type"] == a["type"] for a in accepted)
    wrong = sum(1 for bid in quarantined if bid in truth and not truth[bid]["defective"])
    return max(0.0, (hits - wrong) / len(bad))


class ClassicRubric(Rubric):
    fold_class = LedgerFold

    def judge(self, case: Case, state: LedgerFold) -> Judgement:
        truth = {b.batch_id: b.truth for b in case.batches}
        loads, quarantined = state.loads, state.quarantined
        return Judgement(
            disposition=disposition(truth, loads, quarantined, state.orphans_at_load),
            evidence=evidence(truth, loads, quarantined),
            inspected=state.inspected,
            bad_batches_loaded=sum(1 for bid, t in truth.items() if t["defective"] and loads.get(bid, 0) >= 1),
            clean_batches_refused=sum(1 for bid in quarantined if bid in truth and not truth[bid]["defective"]))


RUBRIC = ClassicRubric()
