"""What the v2 contract finds in each batch of a case, judged as careful-v2 would: no labels.

The same pandera schemas careful-v2 uses (`schemas.py`, through `gold.batch_findings`): the header,
every row, the warehouse and the earlier nights. The customers batches that pass their own checks
(or whose bad rows the contract lets a run hold back, those rows aside) count as loaded before the
orders. The Dagster contract check shows the result.
"""
from __future__ import annotations

from ...kernel.world import BatchFindings


def _record(prepared, bid: str, found) -> BatchFindings:
    from .gold import staged_frame
    df = staged_frame(prepared.batches[bid])
    failing = [(rule, row, rule.column, df.at[row, rule.column] if rule.column in df.columns else None)
               for rule, rows in found.failures for row in rows]
    return BatchFindings(bid, prepared.batches[bid].table, prepared.row_counts[bid], found.rules, failing)


def findings(prepared) -> list[BatchFindings]:
    """Per batch, in case order: the rules it breaks and its failing rows."""
    from .gold import batch_findings  # pandas and pandera: only when a check runs
    from .schemas import disposition
    found = {}
    customers = [bid for bid in prepared.order if prepared.batches[bid].table == "customers"]
    for bid in customers:
        found[bid] = batch_findings(prepared, bid, customers_loaded=[])
    loaded = []
    for bid in customers:
        verdict = disposition(prepared.contract, found[bid])
        if verdict == "quarantine":
            continue
        held = []
        if verdict == "rows":
            from .gold import staged_frame
            keys = staged_frame(prepared.batches[bid])["customer_id"]
            held = sorted({str(keys.iloc[i]) for i in found[bid].bad_rows()})
        loaded.append((bid, held))
    for bid in prepared.order:
        if bid not in found:
            found[bid] = batch_findings(prepared, bid, customers_loaded=loaded)
    return [_record(prepared, bid, found[bid]) for bid in prepared.order]
