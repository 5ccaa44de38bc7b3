"""`gate verify`'s checks: every stored result derived again from what can be derived again.

For each episode in the run store (or in one run):

1. **The store's own checks** (`RunStore.load`): the record's seal under the store's key, the
   case against its hash, the ledger readable, its chain intact, as long and ending on the hash
   recorded when the episode ended, the warehouse and the transcript against their hashes.
2. **The warehouse rebuilt**: the ledger's executed calls applied in order to a fresh episode of
   the stored case must give back the same executed entries (what each load loaded, what each
   read read) and a warehouse byte for byte the stored one.
3. **Played again**, when it can be: an episode of a deterministic agent (`AgentSpec.deterministic`)
   is played again from its case and must give the same ledger (its last hash), warehouse, ending
   and grade. A model cannot be played again without the model: its ledger is **tied to its
   transcript** instead (every tool call of the transcript's model messages, applied in order,
   must give the stored ledger, and each tool result the one the model was sent).
4. **Grades recomputed**: a fresh grade from the stored ledger and warehouse (`grade_stored`)
   against the grade the grading sensor kept, if any; a kept grade that names no stored episode.

Then every **sealed run** (a night, a `gate run`, a Dagster case run) against the manifest it
recorded when it started: episodes missing, extra or duplicated, cases other than the ones it was
sealed with (and, while the case file is unchanged, other than the file's); and every **nightly
summary** recomputed from the episodes its night completed with. Kept grades and summaries are
caches: nothing is read from them but to compare.

What these checks prove, and what they cannot (a key beside the database, a model's transcript
written by whoever can write the store): docs/integrity.md. None of them needs the store's key
except the seals: an edit made with the key still has to survive being played again.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import __version__
from .kernel.actions import tool_call_action
from .kernel.agents import AgentOptionError, UnknownAgent, is_gates_own, resolve_agent
from .kernel.cases import MAX_CASE_FILE_BYTES, Case, CaseError, parse_cases, printable
from .kernel.engine import Session, Sink, play, prepare
from .kernel.errors import GateError, NoRoom
from .kernel.files import read_bytes
from .kernel.grading import grade_stored
from .kernel.ledger import last_hash
from .kernel.records import ABANDONED, API_ERROR, GRADE_KEYS, TIMEOUT, Grade, StoredEpisode
from .kernel.settings import Settings
from .store import (
    API,
    COMPLETE,
    CONTINUATION,
    DIED,
    ENDED,
    NEVER_ENDED,
    NIGHTLY,
    OPEN,
    STOPPED,
    UNREADABLE_JSON,
    RunStore,
    StoreError,
    lock_free,
    sha256,
)
from .tables import summary

COMPARED = (*GRADE_KEYS, "failed")
REDONE = (ABANDONED, API_ERROR, TIMEOUT)  # an attempt a run plays again: not a duplicate
RUN_STATES = {OPEN: "still open", STOPPED: "stopped before it finished", DIED: "its process died",
              COMPLETE: "complete"}


@dataclass(frozen=True)
class Problem:
    """One failed check (or, in `Verification.notes`, one thing worth saying that is not a failure)."""
    episode_id: str
    case_id: str
    agent: str
    what: str

    def __post_init__(self):  # what a hostile row holds (a BLOB, a number) is text here, as `--json` writes it
        for name in ("episode_id", "case_id", "agent", "what"):
            value = getattr(self, name)
            if not isinstance(value, str):
                object.__setattr__(self, name, "" if value is None else str(value))

    def line(self) -> str:
        """One line: what the store holds (ids, names, errors) is written with its unprintable characters escaped."""
        who = " ".join(printable(x) for x in (self.episode_id, self.case_id, self.agent) if x)
        return f"{who}: {printable(self.what)}"


def run_problem(run_id: str, what: str) -> Problem:
    return Problem(f"run {run_id}", "", "", what)


@dataclass
class Verification:
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    fresh: dict[str, Grade] = field(default_factory=dict)
    cases: dict[str, Case | None] = field(default_factory=dict)  # episode id -> its stored case as loaded (None: unread)
    # one Case object per stored case (by its SHA-256), so `cases` holds each distinct case once, not a copy an episode
    distinct_cases: dict[str, Case] = field(default_factory=dict)
    unplayed: dict[tuple[str, str], int] = field(default_factory=dict)  # (agent, why) -> episodes not played again
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("replayed", "tied", "rebuilt", "runs", "nights", "grades"), 0))


def differs(kept: dict, fresh: Grade, whole: bool = False) -> str | None:
    """What a kept grade (a JSON dict) has that a fresh grade has not, or None. `whole`: the kept grade is a
    whole grade as gate writes it (a transcript line's), so every key it has and a grade has is compared, and
    a key a grade has not is a difference; otherwise (a store's row, a sensor's) the rubric's keys."""
    now = fresh.as_dict()
    if "unreadable" in kept:  # the store's word for a row it cannot read; no grade gate makes has the key
        # said in verify's words: a reason in the row (or a transcript line) could be anyone's
        return UNREADABLE_JSON if kept.get("reason") == UNREADABLE_JSON else "the kept grade is not readable"
    changed = [k for k in COMPARED if kept.get(k) != now[k]]
    if changed:
        return (f"the kept grade differs from a fresh grade in {', '.join(changed)} "
                f"(reward {kept.get('reward')!r} kept, {now['reward']!r} fresh)")
    if whole:  # the rest of it: the figures a grade shows beside its reward, a suite's metrics, as JSON writes
        # them (a value is compared by its JSON text, so a NaN a grade holds equals the NaN written for it)
        changed = sorted(k for k, v in now.items() if _json_text(kept.get(k)) != _json_text(v))
        changed += ["keys a grade has not"] if kept.keys() - now.keys() else []
        if changed:
            return f"the kept grade differs from a fresh grade in {', '.join(changed)}"
    return None


def _json_text(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):  # not JSON's (a kept grade's is): it equals nothing a grade holds
        return f"not JSON: {type(value).__name__}"


class _Warehouse(Sink):
    wants_warehouse = True


def _executed(entries: list) -> list[tuple]:
    return [(e.get("action"), e.get("args"), e.get("note")) for e in entries
            if isinstance(e, dict) and e.get("executed") is True]


def rebuild(stored: StoredEpisode, row: dict) -> str | None:
    """Apply the stored ledger's executed calls in order to a fresh episode of the stored case; what differs
    from the stored episode (its executed entries, its warehouse), or None."""
    prepared = prepare(stored.case)  # type: ignore[arg-type]
    try:
        names = {t.name: t.arg_names for t in prepared.suite.tools}
        session = Session(prepared, "rebuild", sinks=(_Warehouse(),))
        ledger = session.episode.ledger
        made: list[dict | None] = []  # per executed entry stored: the entry its call makes now (None: not applied)
        for e in stored.entries:
            if not (isinstance(e, dict) and e.get("executed") is True):
                continue
            action, args = e.get("action"), e.get("args")
            if action in names and isinstance(args, dict):
                before = len(ledger.entries)
                session.call(action, {k: v for k, v in args.items() if k in names[action]})
                new = ledger.entries[before:]
                made.append(new[0] if len(new) == 1 else None)
            else:
                made.append(None)
        result = session.finish()
    finally:
        prepared.close()
    want, got = _executed(stored.entries), _executed(result.ledger)
    if want != got:
        at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        now = made[at] if at < len(made) else None
        refused = (f" (applied now, it is refused: {now.get('note')})"
                   if isinstance(now, dict) and now.get("executed") is False else "")
        return (f"its ledger does not replay: applied to the stored case, executed call {at} "
                f"({want[at][0] if at < len(want) else 'none'}) does not give the entry stored{refused}")
    if result.warehouse is None or sha256(result.warehouse) != row["warehouse_sha256"]:
        return "its warehouse is not what its ledger gives: applied to the stored case, the ledger builds another"
    return None


def _agent_problem(name: str, options: dict, settings: Settings):
    """(spec, None) for an agent that can be played again here, else (None, why not: a note)."""
    if ":" in name and name not in settings.extra_agents:
        return None, f"{name} is a module:Class agent, which `gate verify` imports only when GATE_AGENTS names it"
    try:
        spec = resolve_agent(name, options, contracts=settings.contracts_dir)
    except (UnknownAgent, AgentOptionError) as exc:
        return None, str(exc)
    return spec, None


def replay_agent(stored: StoredEpisode, row: dict, spec, fresh: Grade) -> str | None:
    """Play a deterministic agent again on the stored case; what differs from the stored episode, or None."""
    prepared = prepare(stored.case)  # type: ignore[arg-type]
    try:
        result = play(prepared, spec, sinks=(_Warehouse(),))
    finally:
        prepared.close()
    got, want = last_hash(result.ledger), row["ledger_digest"]
    if got != want or len(result.ledger) != row["ledger_entries"]:
        return (f"played again, {spec.name} gives another episode: {len(result.ledger)} calls ending on "
                f"{got[:12]}, where the stored ledger has {row['ledger_entries']} ending on {str(want)[:12]}")
    if result.warehouse is None or sha256(result.warehouse) != row["warehouse_sha256"]:
        return f"played again, {spec.name} leaves another warehouse than the stored one"
    if (result.end_reason, result.error or None) != (row["end_reason"], row["error"]):
        return (f"played again, {spec.name} ends {result.end_reason!r} ({result.error or 'no error'}), not "
                f"{row['end_reason']!r} as stored")
    if stored.problems:  # the stored episode grades 0 for those: its grade says nothing more
        return None
    now, stored_grade = result.grade.as_dict(), fresh.as_dict()
    changed = [k for k in COMPARED if now[k] != stored_grade[k]]
    return (f"played again, {spec.name} grades {now['reward']!r}, the stored episode {stored_grade['reward']!r} "
            f"(they differ in {', '.join(changed)})") if changed else None


def tie(stored: StoredEpisode, row: dict, log: dict) -> str | None:
    """Apply the tool calls of the transcript's model messages, in order, to a fresh episode of the stored
    case (ending at the first accepted report, as the model's episode did): they must give the stored
    ledger, and each tool result the content the model was sent."""
    messages = log.get("messages")
    if not isinstance(messages, list):
        return "its transcript holds no messages to tie its ledger to"
    prepared = prepare(stored.case)  # type: ignore[arg-type]
    try:
        return _tie(prepared, messages, row)
    finally:
        prepared.close()


def _answers(messages: list, at: int, calls: list) -> list:
    """What the model was sent for each of `calls`, the tool calls of the assistant message at `at`: the content
    of the tool messages that follow it, in order, each naming its call's id (None for a call none answers).
    Paired by place, not looked up by id, so two calls that share an id (a transcript from before ids were made
    unique in a conversation) are each given their own answer."""
    out, k = [], at + 1
    for tc in calls:
        m = messages[k] if k < len(messages) else None
        if isinstance(m, dict) and m.get("role") == "tool" and isinstance(tc, dict) \
                and m.get("tool_call_id") == tc.get("id"):
            out.append(m.get("content"))
            k += 1
        else:
            out.append(None)
    return out


def _tie(prepared, messages: list, row: dict) -> str | None:
    # as a model's episode is played: a call after the accepted report is answered "the episode is over"
    session = Session(prepared, "tie", stop_at_report=True)
    calls = 0
    for at, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list)):
            continue
        for tc, content in zip(m["tool_calls"], _answers(messages, at, m["tool_calls"])):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                session.finish()
                return f"tool call {calls} of its transcript is not a tool call"
            result = session.step(tool_call_action(fn.get("name"), fn.get("arguments"))).result
            if content is not None and json.dumps(result, default=str) != content:
                session.finish()
                return (f"tool call {calls} of its transcript ({str(fn.get('name'))[:60]}) gives another result than "
                        f"the one the transcript says the model was sent")
            calls += 1
    result = session.finish()
    if last_hash(result.ledger) != row["ledger_digest"] or len(result.ledger) != row["ledger_entries"]:
        return (f"its ledger is not the tool calls of its transcript: the transcript's {calls} calls give a ledger "
                f"ending on {last_hash(result.ledger)[:12]}, the stored one ({row['ledger_entries']} entries) ends "
                f"on {str(row['ledger_digest'])[:12]}")
    return None


def _started(row: dict) -> tuple:
    """A row's place in time for ordering: its start, rows whose start is no number (edited) last."""
    when = row["started_at"]
    number = isinstance(when, (int, float)) and not isinstance(when, bool) and when == when
    return (0, when, "") if number else (1, 0.0, repr(when))


def _options(row: dict):
    try:
        return json.loads(row["agent_options"])
    except (ValueError, RecursionError, TypeError):
        return None


def check_episode(store: RunStore, row: dict, settings: Settings, out: Verification,
                  sealed: tuple[str, dict] | None = None) -> None:
    """One episode's checks; `sealed` is (run id, the agent as the manifest of its run records it: name,
    identity, options, deterministic) when its run has one that lists its agent."""
    eid, case_id, agent = row["episode_id"], row["case_id"], row["agent"]

    def problem(what: str) -> None:
        out.problems.append(Problem(eid, case_id, agent, what))

    try:
        stored = store.load(eid)
    except StoreError as exc:
        problem(str(exc))
        return
    problems = list(stored.problems)
    if row["status"] != ENDED and NEVER_ENDED in problems:
        lock = store.run_lock(row["run_id"])
        if lock_free(lock):  # its process, on this machine, is gone
            problems[problems.index(NEVER_ENDED)] = (f"{NEVER_ENDED}: its process died (the next `gate nightly`, "
                                                     f"or the grading sensor, closes it as abandoned)")
        elif lock.exists():  # its process is playing it now
            problems.remove(NEVER_ENDED)
            out.notes.append(Problem(eid, case_id, agent, "still being played (its night's process is running)"))
    for p in problems:
        problem(p)
    out.cases[eid] = stored.case if stored.case is None else out.distinct_cases.setdefault(row["case_sha256"], stored.case)
    grade = out.fresh[eid] = grade_stored(stored)
    kept = store.recorded_grade(eid)
    why = differs(kept, grade) if kept is not None else None
    if why:
        problem(why)
    if row["status"] != ENDED or stored.case is None:
        return
    if not stored.intact:  # what it would be rebuilt or played again from failed a check above: its work is not
        out.notes.append(Problem(eid, case_id, agent, "not rebuilt or played again: its record, case or ledger "
                                                      "failed the checks above"))  # bounded by what gate wrote
        return
    if row["ledger_entries"] is None:  # closed after its process died: nothing of it was recorded
        out.notes.append(Problem(eid, case_id, agent, f"abandoned: {row['error'] or 'cut off'}"))
        return
    why = _unless_unusable("its ledger cannot be applied to its case", rebuild, stored, row)
    out.counts["rebuilt"] += 1
    if why:
        problem(why)
    if row["end_reason"] == ABANDONED:
        out.notes.append(Problem(eid, case_id, agent, f"abandoned: {row['error'] or 'cut off'}"))
        return
    name, options = row.get("agent_name") or agent, stored.options
    if sealed is not None:  # the agent is the one the run was sealed with: that one is played again
        run, declared = sealed
        if (name, _options(row)) != (declared["name"], declared["options"]):
            problem(f"its agent is {name!r} with options {json.dumps(_options(row), sort_keys=True)[:200]}, but run "
                    f"{run} was sealed with {declared['name']!r} with options "
                    f"{json.dumps(declared['options'], sort_keys=True)[:200]} for {agent!r}")
        name, options = declared["name"], declared["options"]
    spec, note = _agent_problem(name, options, settings)
    if spec is None and ":" not in agent:  # its identity may name an agent gate plays again, whatever the name says
        same, _ = _agent_problem(agent, {}, settings)
        if same is not None and same.deterministic and same.identity == agent:
            if is_gates_own(agent):  # the same wherever this gate runs: no run of it was named so
                problem(f"its agent {name!r} cannot be played again here ({note}), but it plays as {agent!r}, an "
                        f"agent gate plays again")
                return
            out.notes.append(Problem(eid, case_id, agent, f"its agent {name!r} is named like {agent!r}, a plugin "
                                                          f"agent installed here that gate plays again: checked as "
                                                          f"its agent's episodes are, not played as the plugin"))
    if sealed is not None and sealed[1]["deterministic"] and (spec is None or not spec.deterministic):
        problem(f"run {sealed[0]} was sealed with {name!r} as a deterministic agent, but it cannot be played "
                f"again here ({note or f'{name} does not say it is deterministic here'})")
        return
    if spec is not None and spec.identity != agent:
        problem(f"its agent {spec.name!r} plays as {spec.identity!r}, not as the stored {agent!r}")
        return
    if spec is not None and spec.deterministic:
        why = _unless_unusable("cannot be played again", replay_agent, stored, row, spec, grade)
        out.counts["replayed"] += 1
        if why:
            problem(why)
        return
    log = store.transcript(eid)
    if log is not None and "messages" in log:
        why = _unless_unusable("its transcript cannot be applied to its case", tie, stored, row, log)
        out.counts["tied"] += 1
        if why:
            problem(why)
        return
    if spec is not None:
        note = f"{spec.name} does not say it is deterministic and keeps no transcript (its warehouses were rebuilt)"
    key = (agent, note or "")
    out.unplayed[key] = out.unplayed.get(key, 0) + 1


def _unless_unusable(words: str, check: Callable[..., str | None], *args) -> str | None:
    """check(*args), the problem it finds or None; or, when what is stored cannot be used that way (a stored
    value gate refuses), the problem "`words` (the error)". No room on this machine to rebuild a database
    (NoRoom) is this machine's error, not the stored result's: it goes through."""
    try:
        return check(*args)
    except NoRoom:
        raise
    except (GateError, KeyError, TypeError, ValueError, RecursionError) as exc:
        return f"{words} ({exc})"


def _slot(row: dict) -> tuple[str, str, int]:
    return row["case_id"], row["agent"], row["rollout"]


def _file_cases(path: str | None, want_sha: str | None) -> tuple[dict[str, str] | None, str | None]:
    """({case id: SHA-256 of the case as stored} from the run's case file, or None; a note saying why the file is
    not checked, or how, None when it is the file the run was sealed with). A file changed since still says
    what each case it holds is: a case of the run's in it that it spells otherwise is a problem, whatever the
    manifest says the file's hash was (whoever holds the key could have written that)."""
    if not path:
        return None, "its case file is not checked (the manifest names none: its cases were handed to gate in memory)"
    if not want_sha:
        return None, f"its case file {path} is not checked (it could not be read when the run was sealed)"
    try:
        data = read_bytes(path, "case file", MAX_CASE_FILE_BYTES, StoreError)
    except StoreError as exc:
        return None, f"its case file is not checked ({exc})"
    same = sha256(data) == want_sha
    try:
        cases: list[Case] = parse_cases(data.decode("utf-8"), path)
    except (CaseError, UnicodeDecodeError) as exc:
        return None, f"its case file is not checked ({exc})"
    note = None if same else (f"its case file {path} changed since the run was sealed: its episodes' cases are checked "
                              f"against the cases it still holds")
    return {c.case_id: sha256(json.dumps(c.data, sort_keys=True)) for c in cases}, note


def _inside(path: str, folder: Path) -> bool:
    """Whether `path` (links followed) is in `folder` or below it."""
    try:
        return Path(path).resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError, ValueError):
        return False


def _superseded(out: Verification, row: dict, how: str) -> None:
    """Note an attempt another episode replaced (added to its note when it was abandoned)."""
    for i, note in enumerate(out.notes):
        if note.episode_id == row["episode_id"] and note.what.startswith("abandoned"):
            out.notes[i] = Problem(note.episode_id, note.case_id, note.agent, f"{note.what}; {how}")
            return
    out.notes.append(Problem(row["episode_id"], row["case_id"], row["agent"], f"superseded: {how}"))


def check_run(manifest: dict, family: list[dict], out: Verification, store_folder: Path | None = None) -> None:
    """A sealed run's episodes (its own and its continuations') against its manifest (`store_folder`: the folder of
    the store's SQLite database file, where a case file is no check on the store's rows; None for a server's)."""
    run_id, body, status = manifest["run_id"], manifest["body"], manifest["status"]
    out.counts["runs"] += 1

    def problem(what: str) -> None:
        out.problems.append(run_problem(run_id, what))

    if not manifest["sealed"]:
        problem("its manifest was altered (its seal does not match)")
    if manifest["problem"] is not None:  # its shape was checked where it was read (RunStore.manifests)
        problem(f"its manifest is not readable ({manifest['problem']})")
        return
    if not manifest["sealed"]:  # not what gate sealed: its episodes are checked on their own, not against what it
        return  # lists (its rollouts x cases x agents could be any size)
    if manifest["kind"] == API:  # it lists its episodes once its caller completed it; each was checked on its own
        if status == COMPLETE:
            _check_listed(run_id, manifest["episodes"], family, out)
        return
    rollouts = body["rollouts"]
    agents = [a["identity"] for a in body["agents"]]
    slots = [(c, a, r) for r in range(rollouts) for c in body["cases"] for a in agents]
    wanted = set(slots)
    shas = body["case_sha256"]
    on_file, why = _file_cases(body.get("cases_file"), body.get("cases_file_sha256"))
    if why:
        out.notes.append(run_problem(run_id, why))
    if on_file is not None and store_folder is not None and _inside(str(body.get("cases_file")), store_folder):
        out.notes.append(run_problem(run_id, f"its case file {body.get('cases_file')} is in the store's folder "
                                             f"{store_folder}: whoever can write the store can write it too, so it checks "
                                             f"nothing a case file kept elsewhere would"))
    if body.get("gate_version") != __version__:
        out.notes.append(run_problem(run_id, f"sealed by gate {body.get('gate_version')}, checked by gate {__version__}"))
    by_slot: dict[tuple, list[dict]] = defaultdict(list)
    for row in family:
        slot = _slot(row)
        if slot not in wanted:
            out.problems.append(Problem(row["episode_id"], row["case_id"], row["agent"],
                                        f"an episode run {run_id}'s manifest does not list (rollout {row['rollout']})"))
            continue
        by_slot[slot].append(row)
        if shas.get(row["case_id"]) != row["case_sha256"]:
            out.problems.append(Problem(row["episode_id"], row["case_id"], row["agent"],
                                        f"its case is not the case run {run_id} was sealed with"))
        elif on_file is not None and on_file.get(row["case_id"]) != row["case_sha256"]:
            out.problems.append(Problem(row["episode_id"], row["case_id"], row["agent"], (
                f"its case is not the one in the case file {body.get('cases_file')}" if row["case_id"] in on_file
                else f"its case is not in the case file {body.get('cases_file')}")))  # (a changed file: renamed?)
    if status == COMPLETE:
        named = {(item[0], item[1], item[2]): item[3] for item in manifest["episodes"] or []}
        for slot in slots:
            rows = by_slot.get(slot, [])
            eid = named.get(slot)
            if eid is None or eid not in {r["episode_id"] for r in rows}:
                problem(f"missing: the episode of {slot[1]} on {slot[0]} (rollout {slot[2]}) "
                        + ("is not in the store" if eid else "was never recorded when the run completed"))
            for r in rows:
                if r["episode_id"] != eid:
                    _superseded(out, r, f"played again in run {run_id} ({eid})")
                elif r["status"] != ENDED or r["end_reason"] == ABANDONED:  # a run completes with what its
                    # episodes earned: none it counted was cut off, or is still being played
                    out.problems.append(Problem(eid, r["case_id"], r["agent"], (
                        f"run {run_id} counted it when it completed, but it "
                        + ("is abandoned" if r["status"] == ENDED else "never ended"))))
        return
    played = 0
    for slot in slots:
        rows = sorted(by_slot.get(slot, []), key=_started)
        if rows:
            played += 1
        counted = [r for r in rows[:-1] if r["end_reason"] not in REDONE]
        if counted:
            problem(f"duplicated: {slot[1]} on {slot[0]} (rollout {slot[2]}) was played {len(counted) + 1} times "
                    f"({', '.join(r['episode_id'] for r in [*counted, rows[-1]])})")
        for r in rows[:-1]:
            if r["end_reason"] in REDONE:
                _superseded(out, r, f"played again ({rows[-1]['episode_id']})")
    out.notes.append(run_problem(run_id, f"{manifest['kind']}, {RUN_STATES.get(status, status)}: {played} of "
                                         f"{len(slots)} episodes played"))


def _check_listed(run_id: str, listed: list[list], family: list[dict], out: Verification) -> None:
    """A complete API run's episodes against the list it was completed with: none deleted, none added."""
    present = {row["episode_id"]: row for row in family}
    named = {item[3]: item for item in listed}
    for eid, (case_id, agent, rollout, _) in named.items():
        row = present.get(eid)
        if row is None:
            out.problems.append(run_problem(run_id, f"missing: episode {eid} of {agent} on {case_id} (rollout "
                                                    f"{rollout}) is not in the store"))
        elif _slot(row) != (case_id, agent, rollout):
            out.problems.append(Problem(eid, row["case_id"], row["agent"], f"run {run_id}'s manifest lists it as "
                                        f"{agent} on {case_id} (rollout {rollout})"))
    for eid, row in present.items():
        if eid not in named:
            out.problems.append(Problem(eid, row["case_id"], row["agent"],
                                        f"an episode run {run_id}'s manifest does not list (it was completed without it)"))


def predates_sealing(rows: list[dict]) -> bool:
    """Whether episodes were stored before gate sealed runs (schema 4 or older): every one has no agent name.
    Schema 5 records the agent's name with every episode and seals it with the row, so clearing it breaks the
    seal; an empty list proves nothing."""
    return bool(rows) and all(r.get("agent_name") is None for r in rows)


def check_nights(store: RunStore, manifests: dict[str, dict], roots: dict[str, str], out: Verification,
                 by_run: dict[str, list[dict]]) -> None:
    """Each kept nightly summary recomputed from the episodes its night completed with; one kept summary for
    each complete night, never two (a night's summary deleted, or copied in as another night's, once passed)."""
    kept_by: dict[str, list[int]] = defaultdict(list)  # the run that kept summaries -> their numbers
    for night in store.nights():
        n, run_id = night["night"], night["run_id"] or ""
        root = roots.get(run_id, run_id)
        kept_by[run_id].append(n)
        manifest = manifests.get(root)
        if manifest is None:
            if predates_sealing(by_run.get(run_id, [])):
                out.notes.append(run_problem(run_id, f"night {n} predates sealed runs (its episodes were stored by "
                                                     f"a gate before schema 5): its summary is not recomputed"))
            else:
                out.problems.append(run_problem(run_id or "-", f"night {n}: its run has no manifest (every night "
                                                               f"gate plays seals one): its summary cannot be recomputed"))
            continue
        if manifest["problem"] is not None or manifest["kind"] in (API, CONTINUATION):
            out.problems.append(run_problem(run_id, f"night {n}: its summary cannot be recomputed (its run's manifest "
                                                    f"{'is not readable' if manifest['problem'] else 'is not a night'})"))
            continue
        body = manifest["body"]
        named = {(i[0], i[1]): i[3] for i in manifest["episodes"] or []}
        agents = [a["identity"] for a in body["agents"]]
        cases: list[Case] = []
        grades: dict[str, list] = {a: [] for a in agents}
        for case_id in body["cases"]:
            eids = [named.get((case_id, a)) for a in agents]
            if None in eids or any(e not in out.fresh for e in eids):
                out.problems.append(run_problem(run_id, f"night {n}: its summary cannot be recomputed (an episode of "
                                                        f"{case_id} is missing)"))
                break
            case = out.cases[eids[0]]  # type: ignore[index]  # loaded when its episode was checked (it is in out.fresh)
            if case is None:  # altered or missing (its episodes say which): nothing to recompute the night from
                out.problems.append(run_problem(run_id, f"night {n}: its summary cannot be recomputed (the stored "
                                                        f"case of {case_id} cannot be read: its episodes say why)"))
                break
            cases.append(case)
            for a, e in zip(agents, eids):
                grades[a].append(out.fresh[e])  # type: ignore[index]
        else:
            out.counts["nights"] += 1
            fresh = {**summary(cases, grades), "cases_file": body.get("cases_file")}
            kept = night["summary"]
            if kept != fresh:
                out.problems.append(run_problem(run_id, f"night {n}: the kept summary differs from a fresh one "
                                                        f"({_summary_difference(kept, fresh)})"))
            elif not night["sealed"]:  # the figures are right; the history does not show them all the same
                out.notes.append(run_problem(run_id, f"night {n}: its kept summary is not sealed with its run (kept by "
                                                     f"an older gate, or its seal edited): the history does not show it"))
    # a run keeps one summary, at its night's last step (a re-execution of the night is a run of its own)
    for run_id, numbers in kept_by.items():
        if run_id and len(numbers) > 1:
            out.problems.append(run_problem(run_id, f"nights {', '.join(map(str, numbers))} are all kept as this "
                                                    f"run's summary: a run keeps one"))
    summarised = {roots.get(run_id, run_id) for run_id in kept_by}
    for root, manifest in manifests.items():
        if (manifest["sealed"] and manifest["problem"] is None and manifest["kind"] == NIGHTLY
                and manifest["status"] == COMPLETE and root not in summarised):
            out.problems.append(run_problem(root, "a complete night with no kept summary (the scoreboard keeps one "
                                                  "for every night it completes)"))


def _summary_difference(kept, fresh: dict) -> str:
    if not isinstance(kept, dict):
        return "the kept one is not readable"
    for agent, figures in fresh["agents"].items():
        had = (kept.get("agents") or {}).get(agent) if isinstance(kept.get("agents"), dict) else None
        if not isinstance(had, dict):
            return f"{agent} is not in the kept one"
        for key, value in figures.items():
            if had.get(key) != value:
                return f"{agent} {key}: {had.get(key)!r} kept, {value!r} fresh"
    extra = sorted(set(kept.get("agents") or {}) - set(fresh["agents"])) if isinstance(kept.get("agents"), dict) else []
    if extra:
        return f"{extra[0]} is in the kept one, not in the night"
    key = next((k for k in fresh if k != "agents" and kept.get(k) != fresh[k]), None)
    return f"{key}: {kept.get(key)!r} kept, {fresh.get(key)!r} fresh" if key else "they differ"


def verify_store(store: RunStore, run_id: str | None = None, settings: Settings | None = None) -> Verification:
    """Every check above, for the store or one run of it."""
    settings = settings or Settings(home=store.home)
    out = Verification()
    if store.key_problem:
        out.problems.append(Problem("store", "", "", store.key_problem))
    rows = store.episodes(run_id=run_id)
    out.checked = len(rows)
    manifests = {m["run_id"]: m for m in store.manifests()}
    roots = {rid: m["body"]["of"] for rid, m in manifests.items()
             if m["kind"] == CONTINUATION and m["problem"] is None}

    def root_of(run: str) -> str | None:
        root = roots.get(run, run)
        return root if root in manifests and manifests[root]["kind"] != CONTINUATION else None

    families: dict[str, list[dict]] = defaultdict(list)
    by_run: dict[str, list[dict]] = defaultdict(list)
    loose: list[dict] = []
    for row in rows:
        by_run[row["run_id"]].append(row)
        root = root_of(row["run_id"])
        manifest = manifests.get(root) if root is not None else None
        if manifest is None:
            loose.append(row)
            check_episode(store, row, settings, out)
            continue
        families[root].append(row)  # type: ignore[index]
        body = manifest["body"] if manifest["problem"] is None and manifest["kind"] != API else None
        declared = next((a for a in body["agents"] if a["identity"] == row["agent"]), None) if body else None
        check_episode(store, row, settings, out, (root, declared) if declared is not None else None)  # type: ignore[arg-type]
    database = store.engine.url.database if store.engine.dialect.name == "sqlite" else None
    folder = Path(database).parent if database and database != ":memory:" else None  # (a server's: none)
    for rid, m in manifests.items():
        if run_id is not None and rid != run_id and roots.get(run_id) != rid:
            continue
        if m["kind"] == CONTINUATION:
            if m["problem"] is not None or not m["sealed"]:
                out.problems.append(run_problem(rid, "its manifest was altered (its seal does not match)"
                                                if m["problem"] is None else
                                                f"its manifest is not readable ({m['problem']})"))
            continue
        check_run(m, families.get(rid, []), out, folder)
    api = [rid for rid in families if manifests[rid]["kind"] == API and manifests[rid]["status"] != COMPLETE]
    if api:
        out.notes.append(Problem("store", "", "", f"{sum(len(families[r]) for r in api)} episodes of {len(api)} run(s) "
                                                  f"stored through the Python API and not completed: each was checked on "
                                                  f"its own (such a run lists its episodes only once its caller "
                                                  f"completes it, RunStore.complete_api_run)"))
    for (agent, why), n in out.unplayed.items():
        out.notes.append(Problem(agent, "", "", f"{n} episode(s) not played again: {why}"))
    old = [r for r in loose if predates_sealing([r])]
    if old:
        out.notes.append(Problem("store", "", "", f"{len(old)} episodes predate sealed runs (stored by a gate before "
                                                  f"schema 5): each was checked on its own"))
    for row in loose:
        if not predates_sealing([row]):
            out.problems.append(Problem(row["episode_id"], row["case_id"], row["agent"],
                                        f"its run {row['run_id']} has no manifest (every run gate stores seals one, "
                                        f"and its episodes are stored after it): the manifest was deleted, or "
                                        f"the episode moved to another run"))
    if run_id is None:
        known = {r["episode_id"]: r for r in rows}
        for g in store.all_grades():
            out.counts["grades"] += 1
            row = known.get(g["episode_id"])
            if row is None:
                out.problems.append(Problem(g["episode_id"], g["case_id"], g["agent"],
                                            f"a kept grade (row {g['grade_seq']}) names no stored episode"))
            elif (g["case_id"], g["agent"]) != (row["case_id"], row["agent"]):
                out.problems.append(Problem(g["episode_id"], g["case_id"], g["agent"],
                                            f"a kept grade (row {g['grade_seq']}) names another case or agent than "
                                            f"its episode ({row['case_id']}, {row['agent']})"))
        check_nights(store, manifests, roots, out, by_run)
    return out


def report(result: Verification) -> dict:
    return {"episodes": result.checked, "problems": [asdict(p) for p in result.problems],
            "episodes_with_problems": len({p.episode_id for p in result.problems}),
            "notes": [asdict(p) for p in result.notes], "checks": dict(result.counts)}


def dumps(result: dict) -> str:
    return json.dumps(result, allow_nan=False)


def key_warning(store: RunStore) -> str | None:
    """One line when the key `store` uses sits beside the database it seals (and so proves nothing against
    whoever can write that folder), else None."""
    if store.key_beside is None:
        return None
    return (f"the store key {store.key_beside} sits beside the database it seals: whoever can rewrite the one "
            f"can rewrite the other; check with a key held elsewhere (--key-file, GATE_STORE_KEY; docs/integrity.md)")


