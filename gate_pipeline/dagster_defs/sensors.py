"""Sensors: grade stored episodes (no run launched), and keep the case partitions in sync.

`grading_sensor` grades from the run store only (stored warehouse + stored ledger + the
case's truth, through `grader.grade_stored`), never from what the agent said. A grade is
computed once per episode (its row in the store is the marker, so a restart cannot grade
twice); the sensor's cursor is the last grade it emitted, so each grade becomes exactly one
observation on `agent_report` for the case's partition. The kept grades are a cache: what the
sensor publishes (the grade and the latest-grade table) it computes again from the stored
episode, so a row inserted or edited in `grades` is never published (it is logged as refused).
An episode whose Dagster run ended while it was still open (a crash, a cancelled run) is closed
with that reason and grades 0, and so is every open episode of a night whose process died on
this machine (`gate nightly` killed); `failed_run_sensor` does the same at once for any failed
run of this code location (the jobs, and the asset page's and backfills' `__ASSET_JOB` runs),
with Dagster's failure message.

Dagster shows every tick that launches no run as skipped, with the result's skip reason as its
message: a grading tick's message and its cursor say what it graded ("2 · careful on
eval-amount-bounds-2 1.0000, naive on eval-amount-bounds-2 0.4500"); only a tick with nothing
to grade says "no new grades". A grade observation's metadata is keyed by its agent
(`careful/reward`, `careful/reason`, `careful/episode_id`, `careful/run`), so the partition's page,
which shows the latest value of each key, keeps the agent that materialized the partition under
`agent`, and each agent's latest grade beside it.
"""

import re

import dagster as dg

from ..kernel.grading import grade_stored, zero_grade
from ..kernel.numbers import whole_number
from ..kernel.records import TERMS, Grade
from ..store import ENDED, RUNNING, StoreError
from ..verify import differs
from .markdown import md_table
from .partitions import cases_partitions, partition_changes
from .resources import CaseLibrary, GateStore

REPORT_KEY = dg.AssetKey("agent_report")
TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_GRADES_PER_TICK = 500


def run_end_reason(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """Why a finished run ended, from its own events: Dagster's failure message, preceded by the
    cancel request that led to it (run monitoring's "exceeding maximum runtime") when there was one."""
    kinds = {dg.DagsterEventType.RUN_CANCELING, dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED}
    messages = [e.dagster_event.message for e in instance.all_logs(run.run_id, of_type=kinds)
                if e.dagster_event is not None and e.dagster_event.message]
    said = " ".join(m if m.endswith(".") else f"{m}." for m in dict.fromkeys(m.strip() for m in messages))
    head = ("the Dagster run failed" if run.status == dg.DagsterRunStatus.FAILURE
            else f"the Dagster run ended ({run.status.value}) before the episode did")
    return f"{head}: {said}" if said else head


def close_abandoned(store, instance: dg.DagsterInstance) -> list[str]:
    """Close episodes still open whose Dagster run has finished (they can never end otherwise)."""
    closed = [eid for _, eids in store.close_dead_runs() for eid in eids]  # nights whose process died here
    for ep in store.episodes(status=RUNNING):  # (a run id edited into something else names no Dagster run)
        run = instance.get_run_by_id(ep["run_id"]) if isinstance(ep["run_id"], str) and ep["run_id"] else None
        if run is not None and run.is_finished and store.close_abandoned(ep["episode_id"],
                                                                         run_end_reason(instance, run)):
            closed.append(ep["episode_id"])
    return closed


def fresh_grade(store, episode_id: str, known: dict[str, Grade]) -> Grade | None:
    """The grade of a stored episode, computed from it (once per tick); None when no such episode ended."""
    if episode_id not in known:
        try:
            row = store.episode(episode_id)
        except StoreError:
            return None
        if row["status"] != ENDED:
            return None
        try:
            known[episode_id] = grade_stored(store.load(episode_id))
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with it, it grades 0 and says why
            known[episode_id] = zero_grade(row["case_id"], "?", f"could not be graded: {exc}")
    return known[episode_id]


def published(store, kept: dict, known: dict[str, Grade]) -> dict | None:
    """A kept grade as the sensor may publish it: computed again from its stored episode (with the kept
    row's agent and run, which must be the episode's); None when it is not what its episode grades."""
    eid = kept.get("episode_id")
    grade = fresh_grade(store, eid, known) if isinstance(eid, str) else None
    if grade is None or differs(kept, grade):
        return None
    row = store.episode(eid)
    if (kept.get("agent"), kept.get("case_id")) != (row["agent"], row["case_id"]):
        return None
    return {**grade.as_dict(), "agent": row["agent"], "episode_id": eid, "run_id": row["run_id"]}


def _number(g: dict, key: str) -> float:
    value = g.get(key, 0.0)
    return value if isinstance(value, (int, float)) else 0.0


def by_agent_table(latest: dict[str, dict]) -> str:
    rows = [[agent, f"{_number(g, 'reward'):.4f}", *(f"{_number(g, t):.4f}" for t in TERMS),
             g.get("bad_batches_loaded", 0), f"{_number(g, 'revenue_error_usd'):,.2f}", g.get("ledger_intact"),
             g.get("reason") or ""]
            for agent, g in sorted(latest.items())]
    return md_table(["agent", "reward", *TERMS, "bad loaded", "revenue error $", "ledger intact", "failure"], rows)


def grade_observation(grade: dict, latest: dict[str, dict], instance: dg.DagsterInstance) -> dg.AssetObservation:
    """One grade as an observation of the case's `agent_report` partition: four keys of the agent's own
    (`careful/reward`, `careful/reason`: why it failed, or empty, `careful/episode_id`, `careful/run`) and the
    table of every agent's latest grade on the case (its terms and figures)."""
    agent = str(grade.get("agent", "?"))
    run_id = str(grade.get("run_id") or "")
    played_by = (dg.MetadataValue.dagster_run(run_id) if run_id and instance.get_run_by_id(run_id) is not None
                 else run_id)  # a Dagster run links to its page; a `gate run` id is text
    metadata = {f"{agent}/reward": _number(grade, "reward"), f"{agent}/reason": str(grade.get("reason") or ""),
                f"{agent}/episode_id": str(grade.get("episode_id", "")), f"{agent}/run": played_by,
                "latest_grade_by_agent": dg.MetadataValue.md(by_agent_table(latest))}
    return dg.AssetObservation(asset_key=REPORT_KEY, partition=str(grade.get("case_id")), metadata=metadata,
                               tags={"gate/agent": TAG_UNSAFE.sub("_", agent)[:63]},  # a tag's characters only
                               description=f"grade of {agent} on {grade.get('case_id')}: {_number(grade, 'reward'):.4f}")


def graded_summary(grades: list[dict], listed: int = 3) -> str:
    """What one tick graded, in a line: each grade when there are few, else each agent's count and mean."""
    failed = sum(1 for g in grades if g.get("failed"))
    tail = f"; {failed} failed" if failed else ""
    if len(grades) <= listed:
        return ", ".join(f"{g.get('agent')} on {g.get('case_id')} {_number(g, 'reward'):.4f}" for g in grades) + tail
    by_agent: dict[str, list[float]] = {}
    for g in grades:
        by_agent.setdefault(str(g.get("agent")), []).append(_number(g, "reward"))
    cases = len({g.get("case_id") for g in grades})
    return (f"{len(grades)} episodes of {cases} cases: "
            + ", ".join(f"{a} {len(r)} (mean {sum(r) / len(r):.4f})" for a, r in by_agent.items()) + tail)


def last_grade(cursor: str | None) -> int:
    """The grade sequence number a cursor starts with (the rest of it is for people)."""
    number = whole_number((cursor or "").split(" ", 1)[0], digits=18, signed=False)  # few enough for a row number
    return 0 if number is None else number


@dg.sensor(minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Grades every ended run from its stored warehouse and ledger, once.")
def grading_sensor(context: dg.SensorEvaluationContext, gate_store: GateStore):
    store = gate_store.open()
    try:
        for episode_id in close_abandoned(store, context.instance):
            context.log.info(f"closed abandoned episode {episode_id}")
        graded = 0
        known: dict[str, Grade] = {}  # every grade this tick computes, by episode
        for episode_id in store.ungraded():  # one episode that cannot be read never stops the others
            row = store.episode(episode_id)
            grade = fresh_grade(store, episode_id, known)
            if grade is not None and store.add_grade(episode_id, row["agent"], grade, row["run_id"]):
                graded += 1
                context.log.info(f"graded {row['agent']} on {grade.case_id}: {grade.reward:.4f}"
                                 + (f" (failed: {grade.reason})" if grade.failed else ""))
        last = last_grade(context.cursor)
        pending = store.grades_after(last, MAX_GRADES_PER_TICK)  # read no more than a tick publishes
        if not pending:
            return dg.SensorResult(skip_reason=dg.SkipReason("no new grades"), cursor=str(last))
        latest: dict[str, dict] = {}
        events = []
        shown: list[dict] = []  # the grades published, each computed again here
        for seq, kept in pending:
            g = published(store, kept, known)
            if g is None:  # a row no grading of this sensor's made: never published
                context.log.warning(f"kept grade {seq} ({kept.get('agent')} on {kept.get('case_id')}, episode "
                                    f"{kept.get('episode_id')}) is not what its stored episode grades: not published")
                continue
            case_id = str(g.get("case_id"))
            if case_id not in latest:
                latest[case_id] = {}
                for agent, other in store.latest_grades(case_id).items():
                    checked = published(store, other, known)
                    if checked is not None:
                        latest[case_id][agent] = checked
            events.append(grade_observation(g, latest[case_id], context.instance))
            shown.append(g)
        summary = graded_summary(shown) if shown else "nothing published"
        context.log.info(f"{graded} episodes graded this tick; {len(events)} grades recorded as observations: "
                         f"{summary}")
        # Dagster shows a tick without a run request as skipped, with this message: here, what it graded
        return dg.SensorResult(asset_events=events, cursor=f"{pending[-1][0]} · {summary}"[:1000],
                               skip_reason=f"recorded {len(events)} grades: {summary}")
    finally:
        store.dispose()


@dg.run_failure_sensor(minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
                       description="Closes the open episodes of any failed run of this code location (the jobs, "
                                   "the asset page's and backfills' runs) with Dagster's failure message, so the "
                                   "grading sensor grades them 0 with that reason.")
def failed_run_sensor(context: dg.RunFailureSensorContext, gate_store: GateStore):
    store = gate_store.open()
    try:
        reason = run_end_reason(context.instance, context.dagster_run)
        for ep in store.episodes(run_id=context.dagster_run.run_id, status=RUNNING):
            if store.close_abandoned(ep["episode_id"], reason):
                context.log.info(f"closed episode {ep['episode_id']} of failed run {context.dagster_run.run_id}")
    finally:
        store.dispose()


@dg.sensor(minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Adds a `cases` partition for each case in the case files and removes vanished ones "
                       "(`gate ui` also does this before the UI starts).")
def case_partitions_sensor(context: dg.SensorEvaluationContext, case_library: CaseLibrary):
    add, delete, problems = partition_changes(context.instance, case_library.settings().cases_dir)
    for problem in problems:
        context.log.warning(problem)
    requests = []
    if add:
        requests.append(cases_partitions.build_add_request(add))
    if delete:
        requests.append(cases_partitions.build_delete_request(delete))
    if not requests:
        return dg.SkipReason("case partitions match the case files")
    return dg.SensorResult(dynamic_partitions_requests=requests)
