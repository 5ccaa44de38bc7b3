"""Re-derive every stored episode's grade from first principles and say what does not hold.

For each episode in the run store (or in one run): the store's own checks (`RunStore.load`:
the record's seal, the case against its hash, the ledger readable, its chain intact, as long
and ending on the hash recorded when the episode ended, the warehouse image against its hash),
then a fresh grade from the stored ledger and warehouse (`grader.grade_stored`) against the
grade kept for it, if any. For a `gate run` directory, each transcript line is also checked
against the stored episode it names: a transcript is an export, and a line that claims another
grade was edited (`model_agent.rollouts.verify_transcripts`). `gate verify`, the grading sensor, `gate nightly` and `gate run --resume`
all rely on the same checks (through `grade_stored`): a tampered episode grades 0, with why.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .kernel.grading import grade_stored
from .kernel.records import GRADE_KEYS, Grade
from .store import RunStore, StoreError

COMPARED = (*GRADE_KEYS, "failed")


@dataclass(frozen=True)
class Problem:
    episode_id: str
    case_id: str
    agent: str
    what: str

    def line(self) -> str:
        return f"{self.episode_id} {self.case_id} {self.agent}: {self.what}"


def differs(kept: dict, fresh: Grade) -> str | None:
    """What a kept grade (a JSON dict) has that a fresh grade has not, or None."""
    now = fresh.as_dict()
    if kept.get("unreadable"):
        return kept.get("reason", "the kept grade is not readable")
    changed = [k for k in COMPARED if kept.get(k) != now[k]]
    if changed:
        return (f"the kept grade differs from a fresh grade in {', '.join(changed)} "
                f"(reward {kept.get('reward')!r} kept, {now['reward']!r} fresh)")
    return None


def verify_store(store: RunStore, run_id: str | None = None) -> tuple[int, list[Problem], dict[str, Grade]]:
    """(episodes checked, problems, fresh grade per episode id) for the store, or one run of it."""
    problems: list[Problem] = []
    fresh: dict[str, Grade] = {}
    rows = store.episodes(run_id=run_id)
    for row in rows:
        eid, case_id, agent = row["episode_id"], row["case_id"], row["agent"]
        try:
            stored = store.load(eid)
        except StoreError as exc:
            problems.append(Problem(eid, case_id, agent, str(exc)))
            continue
        problems += [Problem(eid, case_id, agent, p) for p in stored.problems]
        grade = fresh[eid] = grade_stored(stored)
        kept = store.recorded_grade(eid)
        why = differs(kept, grade) if kept is not None else None
        if why:
            problems.append(Problem(eid, case_id, agent, why))
    return len(rows), problems, fresh


def report(checked: int, problems: list[Problem]) -> dict:
    return {"episodes": checked, "problems": [asdict(p) for p in problems],
            "episodes_with_problems": len({p.episode_id for p in problems})}


def dumps(result: dict) -> str:
    return json.dumps(result, allow_nan=False)
