"""The suites gate plays, and what differs between them: the prepared case, the tools, the families.

`classic` is the classic bad-batch-gate suite, exactly; `v2` is suite v2 (`suite_v2/`). A case
says which it belongs to (`cases.suite_of`: a v2 case has `"suite": "v2"`, a classic case no
`suite` key). Every surface goes through here to prepare a case and open an episode of it, so
an episode offers the tools its suite defines: the classic seven, or those and v2's three.
"""
from __future__ import annotations

from .cases import suite_of, suite_of_cases
from .contract import SUITE_COLUMNS, SUITE_DEFECT_TYPES, SUITES
from .generator import FAMILIES as CLASSIC_FAMILIES
from .suite_v2.generator import FAMILIES as V2_FAMILIES
from .suite_v2.tools import SIGNATURES_V2, EpisodeV2
from .suite_v2.world import PreparedCaseV2
from .tools import SIGNATURES, Episode
from .world import PreparedCase

__all__ = ["SUITES", "suite_of", "prepare", "episode_class", "signatures", "families", "suite_of_cases",
           "columns", "defect_types"]

_PREPARED = {"classic": PreparedCase, "v2": PreparedCaseV2}
_EPISODES = {"classic": Episode, "v2": EpisodeV2}
_SIGNATURES = {"classic": SIGNATURES, "v2": SIGNATURES_V2}
FAMILIES = {"classic": CLASSIC_FAMILIES, "v2": V2_FAMILIES}


def prepare(case: dict):
    """The prepared case (database image, listing, profiles, correct mart) of the case's suite."""
    return _PREPARED[suite_of(case)](case)


def warehouse_row_counts(case: dict) -> dict[str, int]:
    """Rows per warehouse table of a case's seed warehouse ({"customers": n, "orders": m})."""
    if suite_of(case) == "v2":
        from .suite_v2.files import rows_of
        return {t: sum(1 for _ in rows_of(case["warehouse"][t])) for t in ("customers", "orders")}
    return {t: len(rows) for t, rows in case["warehouse"].items()}


def contract_failures(prepared) -> list[tuple[str, str, int, list, list]]:
    """Per batch of a v2 case: (batch id, table, rows, rules that failed, [(rule, row, column, value)]), the
    shape of the Dagster contract check (the classic case's are computed by the check itself)."""
    from .suite_v2.gold import case_findings, staged_frame
    out = []
    for bid, found in case_findings(prepared).items():
        df = staged_frame(prepared.batches[bid])
        failing = [(rule, row, rule.column, df.at[row, rule.column] if rule.column in df.columns else None)
                   for rule, rows in found.failures for row in rows]
        out.append((bid, prepared.batches[bid]["table"], prepared.row_counts[bid], found.rules, failing))
    return out


def suite_of_prepared(prepared) -> str:
    return getattr(prepared, "suite", "classic")


def episode_class(prepared):
    """The episode (tools over a world) of a prepared case's suite."""
    return _EPISODES[suite_of_prepared(prepared)]


def signatures(suite: str = "classic") -> dict:
    """The tools an episode of `suite` offers: name -> ((argument, kind), ...)."""
    return _SIGNATURES[suite]


def families(suite: str = "classic") -> tuple[str, ...]:
    return FAMILIES[suite]


def columns(suite: str = "classic") -> dict:
    return SUITE_COLUMNS[suite]


def defect_types(suite: str = "classic") -> tuple[str, ...]:
    return SUITE_DEFECT_TYPES[suite]

