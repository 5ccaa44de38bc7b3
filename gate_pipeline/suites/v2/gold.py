"""What the v2 contract finds in each batch of a case, from the case alone (gate's side).

The same pandera schemas careful-v2 uses (`suite_v2.schemas`), with the warehouse figures read
from the prepared database as a correct run would see them: customers batches the truth loads
count as loaded first, and the values the case's owner accepts allowed.

- `batch_findings`: the rules a batch breaks and on which rows (`findings.py`, the Dagster check);
- `gold_rows`: the dense reward's Layer 2 target, the raw rows of every defective batch that
  break the rules its truth label names (file and history rules name no row).
"""
from __future__ import annotations

import io

from .contract import COLUMNS_V2
from .history import existing_keys_sql, missing_customers_sql, repeated_rows_sql, usual, usual_sql
from .schemas import Findings, HistoryFigures, findings, median_of_amounts


def staged_frame(batch):
    """A staged CSV batch as read for the schemas: every value a string, nothing read as missing."""
    import pandas as pd
    return pd.read_csv(io.StringIO(batch.data["csv"]), dtype=str, keep_default_na=False, na_filter=False)


def loaded_by_truth(prepared) -> list[tuple[str, list[str]]]:
    """The customers batches a correct run loads (all or some of their rows), by the truth labels: each
    with the keys of the rows it holds back."""
    out = []
    for b in prepared.order:
        truth = prepared.truth[b]
        if prepared.batches[b].table == "customers" and truth["disposition"] != "quarantine":
            out.append((b, sorted({k for d in truth["defects"] for k in d.get("keys", ())})))
    return out


def batch_findings(prepared, batch_id: str, df=None, customers_loaded: list[tuple[str, list[str]]] | None = None) \
        -> Findings:
    """The rules one batch breaks, as gate judges it from the case (see the module docstring), the
    customers batches in `customers_loaded` ((batch id, keys of its rows held back)) counted as loaded
    before it (default: as the truth loads them)."""
    with prepared.reading() as conn:
        return _batch_findings(prepared, conn, batch_id, df, customers_loaded)


def _batch_findings(prepared, conn, batch_id: str, df, customers_loaded) -> Findings:
    batch = prepared.batches[batch_id]
    table, header, staging = batch.table, prepared.headers[batch_id], prepared.staging[batch_id]
    contract = prepared.contract
    df = staged_frame(batch) if df is None else df
    keys: dict[str, set] = {}
    tonight = list(prepared.order)
    drift_free = list(header) == list(COLUMNS_V2[table])
    figures = None
    if drift_free:
        keys["existing_keys"] = {r[0] for r in conn.execute(existing_keys_sql(table, staging, tonight))}
        repeated = None
        if table == "orders":
            loaded = loaded_by_truth(prepared) if customers_loaded is None else customers_loaded
            first = [(prepared.staging[b], held) for b, held in loaded
                     if list(prepared.headers[b]) == list(COLUMNS_V2["customers"])]
            held = sorted({k for _, h in first for k in h})
            keys["missing_customers"] = {r[0] for r in conn.execute(
                missing_customers_sql(staging, [t for t, _ in first], held))}
            repeated = conn.execute(repeated_rows_sql(staging, tonight)).fetchone()[0]
        usual_rows, usual_median = usual(conn.execute(usual_sql(table, batch.source)).fetchall())
        median = median_of_amounts(df["amount"]) if table == "orders" else None
        figures = HistoryFigures(prepared.row_counts[batch_id], usual_rows, median, usual_median, repeated)
    return findings(contract, table, header, df if drift_free else None, keys, figures,
                    accepted=prepared.owner.accepted())


def gold_rows(case, prepared) -> list[tuple]:
    """The rows of every defective batch that break the rule(s) its truth label names, as tuples of the
    file's raw values in header order; batches in case order, rows in file order (`prepared`: the case
    prepared, whose database the warehouse figures are read from)."""
    out: list[tuple] = []
    for bid in prepared.order:
        truth = prepared.truth[bid]
        if not truth["defective"]:
            continue
        df = staged_frame(prepared.batches[bid])
        labelled = {(d["column"], d["type"]) for d in truth["defects"]}
        found = batch_findings(prepared, bid, df)
        picked = sorted({i for rule, rows in found.failures if (rule.column, rule.defect_type) in labelled for i in rows})
        out.extend(tuple(row) for row in df.iloc[picked].itertuples(index=False, name=None))
    return out
