"""Many rollouts of a model on many cases, concurrently (asyncio), through the one engine.

Every rollout is an episode like any other: the engine plays it (`engine.play_async`), the run
store keeps it (`store.StoreSink`, the same store and records as the Dagster jobs, the model's
conversation included), and a transcript line is written beside it as an export (messages, tool
calls, ledger, grade, timings, token usage). A run also lives in runs/<run-id>/: `run.json`
(what was asked) and `transcripts.jsonl`; the store holds its manifest, sealed when the run
first starts (its cases, model and rollouts: what it must produce), and sealed again as complete
with the episodes that count once every rollout has one.

Crash-safe: ended episodes are written STORE_BATCH to a transaction (or once STORE_EVERY_S
has passed), their transcript lines first (flushed to disk), so every stored episode has its
line and a kill -9 loses at most the rollouts of the last second; a resume first makes the
transcript file hold exactly the stored episodes' lines (dropping those of episodes a killed
process never stored, writing any the store has and the file lacks), then plays only the
rollouts the store has no ended episode for, and the ones that ended on an API error or timeout
(a server fault, not the model's), or that were cut off. A rollout that ran out of turns is the
model's result and is kept. Grades for the tables come from the store, graded again from the
stored ledger and warehouse, never from transcript lines. SIGTERM (what a scheduler sends) is
handled as Ctrl-C (`gate run`): the rollouts in flight are recorded as cut off.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Callable

from ..kernel.actions import ledger_repr
from ..kernel.agents import AgentSpec, own_identity
from ..kernel.cases import Case
from ..kernel.engine import fewer_collections, play_async
from ..kernel.errors import GateError
from ..kernel.files import json_lines, read_text, writable_file
from ..kernel.grading import grade_stored
from ..kernel.pool import CasePool
from ..kernel.records import ABANDONED, API_ERROR, TIMEOUT, EpisodeResult, Grade
from ..store import ENDED, LockHeld, RunStore, StoreSink, hold_lock, manifest_body, process_name
from ..verify import Problem, differs
from .agent import ModelAgent, ModelSettings, describe_error, make_client
from .tool_schemas import tool_schemas

TRANSCRIPTS, META, TOOLS = "transcripts.jsonl", "run.json", "tools.json"
META_LIMIT = 2**20  # a run description is a few hundred bytes
REDONE_ON_RESUME = (API_ERROR, TIMEOUT, ABANDONED)
STORE_BATCH, STORE_EVERY_S = 16, 1.0  # ended episodes are written 16 to a transaction, or after a second
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# settings that change what a rollout means: a resumed run must not mix them
BINDING = ("model", "base_url", "temperature", "max_turns", "max_tokens", "tool_choice", "text_tool_calls")


class RunError(GateError, ValueError):
    """A run directory that cannot be used (bad id, corrupt transcript, other settings); one line."""


class EndpointError(GateError):
    """The model endpoint cannot serve the run (unreachable, wrong URL, key refused); one line with the cause."""


PREFLIGHT_TIMEOUT_S = 10.0
ABORT_AFTER = 8  # rollouts in a row ending on an API error: the endpoint is down, stop asking it


PROBE = [{"role": "user", "content": "Say OK."}]


def _endpoint_error(exc, url: str, settings: ModelSettings) -> EndpointError | None:
    """The EndpointError an answer of the check means, or None when it says the endpoint is there."""
    import openai
    if isinstance(exc, openai.APIConnectionError):  # refused, unresolvable, timed out
        return EndpointError(f"cannot reach {url}: {describe_error(exc)}")
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return EndpointError(f"{url} refused the API key ({describe_error(exc)}); the key is read from "
                             f"${settings.api_key_env}")
    if isinstance(exc, openai.NotFoundError):
        return EndpointError(f"{url} answered {describe_error(exc)}: check --base-url (an API root, usually "
                             f"ending in /v1) and --model")
    return None


async def preflight(client, settings: ModelSettings) -> str:
    """Check the endpoint before the run, through the API's cheap routes, never a generation:
    `GET /models` (`client.models.list()`); a server without that route gets one request for one
    token. A 400 or 422 to that request says the route exists and reads requests. No retries, at most
    PREFLIGHT_TIMEOUT_S a request. Returns the route that answered; raises EndpointError with the cause."""
    import openai

    root = settings.base_url.rstrip("/")
    probe = client.with_options(max_retries=0, timeout=min(settings.timeout, PREFLIGHT_TIMEOUT_S))
    try:
        await probe.models.list()
        return "models"
    except Exception as exc:  # noqa: BLE001 - no model list: the completions route decides, unless it cannot
        error = _endpoint_error(exc, f"{root}/models", settings)
        if error is not None and not isinstance(exc, openai.NotFoundError):
            raise error from None  # unreachable, or the key was refused: a completion would fare no better
    url = f"{root}/chat/completions"
    try:
        await probe.chat.completions.create(model=settings.model, messages=PROBE, max_tokens=1)
    except Exception as exc:  # noqa: BLE001
        error = _endpoint_error(exc, url, settings)
        if error is not None:
            raise error from None
    return "chat/completions"  # answered, or read and refused the request (400, 422...): the server is there


def rollout_key(case_id: str, index: int) -> str:
    return f"{case_id}#{index}"


def default_run_id(model: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{re.sub(r'[^A-Za-z0-9._-]+', '-', model).strip('-.')[:40] or 'model'}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.match(run_id) or ".." in run_id:
        raise RunError(f"run id {run_id!r}: use letters, digits, '.', '_' or '-' (at most 100, no '..')")
    return run_id


def read_transcripts(path: Path) -> list[dict]:
    """Every transcript line (the export); a torn last line (the process died mid-write) is skipped."""
    if not path.exists():
        return []
    lines = json_lines(read_text(path, "transcript file", None, RunError))
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        why = None
        try:
            record = json.loads(line)
        except RecursionError:
            why = "JSON nested too deep"
        except ValueError as exc:
            why = f"not JSON: {exc}"
        else:
            if not isinstance(record, dict) or not isinstance(record.get("key"), str):
                why = "not a JSON object with a text 'key'"
            elif not isinstance(record.get("episode_id", ""), str):  # (a list or an object: no id can be one)
                why = "its 'episode_id' is not text"
        if why is not None:
            if n == len(lines):
                continue
            raise RunError(f"{path}:{n}: not a rollout record ({why})")
        records.append(record)
    return records


def _lines_of(path: Path) -> list[tuple[str, dict | None]]:
    """(line, its record or None when it is not one) for every non-empty line of a transcript file."""
    if not path.exists():
        return []
    out: list[tuple[str, dict | None]] = []
    for line in json_lines(read_text(path, "transcript file", None, RunError)):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        out.append((line, record if isinstance(record, dict) and isinstance(record.get("episode_id"), str) else None))
    return out


def reconcile(path: Path, store: RunStore, run_id: str) -> tuple[int, int]:
    """Make the transcript file hold one line for each episode the store holds for the run, and nothing
    else (run before anything is played): lines of episodes a killed process never stored, torn or
    repeated lines go; a stored episode without a line gets one, written from the store. The file is
    rewritten (atomically) only when it changes. (lines dropped, lines written)."""
    rows = {r["episode_id"]: r for r in store.episodes(run_id=run_id) if r["status"] == ENDED}
    kept: list[str] = []
    seen: set[str] = set()
    lines = _lines_of(path)
    for line, record in lines:
        eid = record["episode_id"] if record is not None else None
        if eid in rows and eid not in seen:
            seen.add(eid)
            kept.append(line)
    missing = [eid for eid in rows if eid not in seen]
    for eid in missing:
        kept.append(json.dumps(stored_record(store, rows[eid]), default=str))
    dropped = len(lines) - (len(kept) - len(missing))
    torn = _torn(path)
    if dropped or missing or torn:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in kept))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return dropped, len(missing)


def _torn(path: Path) -> bool:
    """Whether the file ends in a half-written line (a process killed mid-write)."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def stored_record(store: RunStore, row: dict) -> dict:
    """An episode's transcript line made from the store (for one whose line was lost): what was stored,
    graded again."""
    stored = store.load(row["episode_id"])
    g = grade_stored(stored)
    family = stored.case.family if stored.case is not None else ""
    result = EpisodeResult(row["episode_id"], row["case_id"], family, row["agent"], g, stored.entries,
                           row["end_reason"] or "", row["error"] or "", row["run_id"], row["rollout"],
                           agent_log=store.transcript(row["episode_id"]), started_at=row["started_at"],
                           seconds=(row["ended_at"] or row["started_at"]) - row["started_at"])
    return transcript_record(result)


def stored_rollouts(store: RunStore, run_id: str) -> dict[str, dict]:
    """The latest stored episode row per rollout key of a run."""
    return {rollout_key(row["case_id"], row["rollout"]): row for row in store.episodes(run_id=run_id)}


def pending(cases: list[Case], rollouts: int, done: dict[str, dict]) -> list[tuple[Case, int]]:
    """The rollouts to play: never played, or ended by a server fault or cut off."""
    out = []
    for case in cases:
        for i in range(rollouts):
            row = done.get(rollout_key(case.case_id, i))
            if row is None or row["status"] != ENDED or row["end_reason"] in REDONE_ON_RESUME:
                out.append((case, i))
    return out


def write_tools(run_dir: Path, cases: list[Case]) -> None:
    """runs/<run-id>/tools.json: the tools schema and system prompt each suite of the run's cases gave
    the model, as sent (`tool_schemas`); rewritten on every start, so it says what the last start sent."""
    from ..kernel.suite import suites
    names = sorted({case.suite for case in cases})
    doc = {name: {"system_prompt": suites.get(name).prompt, "tools": tool_schemas(suites.get(name))}
           for name in names}
    writable_file(run_dir / TOOLS, "tools file", RunError).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _check_meta(run_dir: Path, settings: ModelSettings, rollouts: int) -> None:
    meta_path = run_dir / META
    wanted = {k: getattr(settings, k) for k in BINDING}
    if os.path.lexists(meta_path):
        text = read_text(meta_path, "run description", META_LIMIT, RunError)  # a FIFO there: refused, not waited on
        try:
            meta = json.loads(text)
        except RecursionError:
            raise RunError(f"{meta_path}: not a run description (JSON nested too deep)") from None
        except ValueError as exc:
            raise RunError(f"{meta_path}: not a run description (not JSON: {exc})") from None
        if not isinstance(meta, dict) or "settings" not in meta:
            raise RunError(f"{meta_path}: not a run description (not a JSON object with 'settings')")
        before = meta["settings"]
        if not isinstance(before, dict):
            raise RunError(f"{meta_path}: not a run description ('settings' is not an object)")
        for key, value in wanted.items():
            if before.get(key) != value:
                raise RunError(f"run {run_dir.name!r} was made with {key}={before.get(key)!r}, not {value!r}; "
                               f"use another --run-id")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"run_id": run_dir.name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "settings": settings.public(), "rollouts": rollouts}
    writable_file(meta_path, "run description", RunError).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def transcript_record(result: EpisodeResult) -> dict:
    """One transcript line: the episode and the model's side of it."""
    log = result.agent_log or {}
    g = result.grade
    return {
        "run_id": result.run_id, "key": rollout_key(result.case_id, result.rollout), "episode_id": result.episode_id,
        "case_id": result.case_id, "family": result.family, "rollout": result.rollout, "model": result.agent,
        "finished": g.finished, "end_reason": result.end_reason, "error": result.error, "reward": g.reward,
        "turns": log.get("turns", 0), "counts": log.get("counts", {}), "usage": log.get("usage", {}),
        "timings": {"started": datetime.fromtimestamp(result.started_at, timezone.utc).isoformat(
                        timespec="milliseconds"),
                    "wall_seconds": round(result.seconds, 6), "model_seconds": log.get("model_seconds", 0.0),
                    "tool_seconds": log.get("tool_seconds", 0.0)},
        "grade": g.as_dict(), "tool_calls": log.get("tool_calls", []), "messages": log.get("messages", []),
        "ledger": result.ledger, "settings": log.get("settings", {}),
    }


class TranscriptWriter:
    """Writes finished episodes as JSON lines (the run's transcript export), flushed to disk: the run's
    StoreSink calls it with each batch before the batch's transaction."""

    def __init__(self, out):
        self.out = out

    def __call__(self, results: list[EpisodeResult]) -> None:
        self.out.write("".join(json.dumps(transcript_record(r), default=str) + "\n" for r in results))
        self.out.flush()
        os.fsync(self.out.fileno())


def run_records(store: RunStore, cases: list[Case], rollouts: int, run_id: str,
                played: dict[str, EpisodeResult] | None = None, counts: dict[str, dict] | None = None) -> list[dict]:
    """One record per ended rollout of the run, in case order. A rollout played in this process
    (`played`, by episode id) brings its grade; every other one, kept from before, is graded again
    from the store (its stored ledger and warehouse), never taken from a transcript. `counts` adds
    each rollout's model-side counters from the transcripts."""
    done = stored_rollouts(store, run_id)
    played = played or {}
    out = []
    for case in cases:
        for i in range(rollouts):
            row = done.get(rollout_key(case.case_id, i))
            if row is None or row["status"] != ENDED:
                continue
            result = played.get(row["episode_id"])
            g = result.grade if result is not None else grade_stored(store.load(row["episode_id"]))
            line = (counts or {}).get(row["episode_id"], {})
            out.append({"key": rollout_key(case.case_id, i), "case_id": case.case_id, "family": case.family,
                        "rollout": i, "episode_id": row["episode_id"], "end_reason": row["end_reason"],
                        "error": row["error"] or "", "reward": g.reward, "grade": g,
                        "counts": line.get("counts", {}), "usage": line.get("usage", {})})
    return out


def model_spec(settings: ModelSettings, client) -> AgentSpec:
    """The model agent with a shared client: identity is the model's name, as on every surface (one that is
    another agent's name is refused first: `own_identity`)."""
    return AgentSpec("model", settings.public(), partial(ModelAgent, client=client), settings.model)


LOCK = ".lock"


@contextmanager
def run_lock(run_dir: Path):
    """Hold the run directory for this process: a second `gate run` with the same id is refused at
    once (the lock goes with the process, however it ends)."""
    try:
        with hold_lock(run_dir / LOCK, f"process {os.getpid()}"):
            yield
    except LockHeld as exc:
        raise RunError(f"run {run_dir.name!r} is being played by {exc}; wait for it, or use another "
                       f"--run-id") from None


def _seal(store: RunStore, run_id: str, body: dict) -> None:
    """Seal the run's manifest when it first starts; a resume must ask for the same episodes."""
    sealed = store.seal_run(run_id, "run", body)
    before = sealed["body"] if isinstance(sealed["body"], dict) else {}
    for key, what in (("cases", "cases"), ("case_sha256", "cases"), ("rollouts", "rollouts per case")):
        if before.get(key) != body[key]:
            n, r = len(before.get("cases") or []), before.get("rollouts")
            raise RunError(f"run {run_id!r} was sealed for {n} cases x {r} rollouts (of "
                           f"{before.get('cases_file')}); these {what} differ: use another --run-id")
    if [a.get("identity") for a in before.get("agents", [])] != [a["identity"] for a in body["agents"]]:
        raise RunError(f"run {run_id!r} was sealed for another model; use another --run-id")


async def run_rollouts(cases: list[Case], settings: ModelSettings, rollouts: int, concurrency: int,
                       run_dir: Path, store: RunStore,
                       on_done: Callable[[EpisodeResult], None] | None = None, cases_file: str | Path | None = None) -> dict:
    """Run (or resume) a run; returns {"records": run_records(...), "new": n, "kept": n}."""
    check_run_id(run_dir.name)
    own_identity("model", settings.model)  # a model named as another agent is refused before anything is made
    with run_lock(run_dir):
        return await _run(cases, settings, rollouts, concurrency, run_dir, store, on_done, cases_file)


async def _run(cases, settings, rollouts, concurrency, run_dir, store, on_done, cases_file) -> dict:
    run_id = run_dir.name
    _check_meta(run_dir, settings, rollouts)
    write_tools(run_dir, cases)
    path = run_dir / TRANSCRIPTS
    client = make_client(settings)
    spec = model_spec(settings, client)
    try:
        _seal(store, run_id, manifest_body(cases, cases_file, [spec], rollouts, process_name("gate run")))
        reconcile(path, store, run_id)  # before anything is played: the file holds what the store holds
    except BaseException:
        await client.close()
        raise
    todo = pending(cases, rollouts, stored_rollouts(store, run_id))
    kept = len(cases) * rollouts - len(todo)
    queue: asyncio.Queue = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    pool = CasePool(cases)
    played: dict[str, EpisodeResult] = {}
    failing: list[str] = []  # the errors of the latest rollouts, while they keep ending on an API error

    async def worker(sinks):
        while len(failing) < ABORT_AFTER:
            try:
                case, index = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result = await play_async(pool.prepared(case.case_id), spec, sinks=sinks, run_id=run_id, rollout=index)
            played[result.episode_id] = result
            if result.end_reason == API_ERROR:
                failing.append(result.error)
            else:
                failing.clear()
            if on_done:
                on_done(result)

    if todo:
        try:
            await preflight(client, settings)
        except BaseException:
            await client.close()
            raise
    try:
        with path.open("a", encoding="utf-8") as out, fewer_collections():
            # episodes are written as they end, STORE_BATCH to a transaction, each batch's transcript lines
            # first: a cut-off rollout, or one not yet written, is played again on resume
            keep = StoreSink(store, announce=False, batch=STORE_BATCH, before_commit=TranscriptWriter(out),
                             every=STORE_EVERY_S)
            tasks = [asyncio.ensure_future(worker((keep,))) for _ in range(max(1, min(concurrency, len(todo) or 1)))]
            try:
                await asyncio.gather(*tasks)
            except BaseException:  # interrupted: let every rollout in flight record itself before the file closes
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            finally:
                keep.flush()
    finally:
        await client.close()
    if len(failing) >= ABORT_AFTER:
        raise EndpointError(f"stopped after {len(failing)} rollouts in a row ended on an API error (the last: "
                            f"{failing[-1]}); {len(played)} played, the same run id resumes the rest")
    counts = {eid: r.agent_log or {} for eid, r in played.items()}
    if kept:  # the counters of rollouts kept from before are in their transcript lines
        counts = {**{r.get("episode_id"): r for r in read_transcripts(path)}, **counts}
    done = stored_rollouts(store, run_id)
    if not pending(cases, rollouts, done):  # every rollout has its episode: seal the run as complete
        store.complete_run(run_id, [(c.case_id, spec.identity, i, done[rollout_key(c.case_id, i)]["episode_id"])
                                    for i in range(rollouts) for c in cases])
    return {"records": run_records(store, cases, rollouts, run_id, played, counts), "new": len(todo), "kept": kept}


def _claims_beside_the_grade(line: dict, row: dict, grade: Grade, run_id: str) -> str | None:
    """The first of a transcript line's top-level fields that is not what the store holds (the episode's row and
    its fresh grade), in words, or None: the line is read as the run's result, not only its `grade`."""
    held = {"run_id": run_id, "episode_id": row["episode_id"], "case_id": row["case_id"], "model": row["agent"],
            "rollout": row["rollout"], "key": rollout_key(row["case_id"], row["rollout"]), "family": grade.family,
            "finished": grade.finished, "end_reason": row["end_reason"],
            "error": row["error"] or "", "reward": grade.reward}
    for key, value in held.items():
        claimed = line.get(key)
        if claimed != value or isinstance(claimed, bool) != isinstance(value, bool):  # 1 is not True
            return f"{key} {ledger_repr(claimed)[:80]}, where the store holds {value!r}"[:200]
    return None


def verify_transcripts(path: Path, store: RunStore, run_id: str, fresh: dict[str, Grade]) -> list[Problem]:
    """Each transcript line against the stored episode it names (`fresh`: grade per episode id): one line
    per stored episode of the run, its grade, ledger and messages the store's."""
    try:
        lines = read_transcripts(path)
    except RunError as exc:
        return [Problem("-", "-", "-", str(exc))]
    rows = {r["episode_id"]: r for r in store.episodes(run_id=run_id) if r["status"] == ENDED}
    problems = []
    seen: set[str] = set()
    for line in lines:
        eid = line.get("episode_id")
        case_id, agent = str(line.get("case_id")), str(line.get("model"))
        if eid not in fresh or eid not in rows:
            problems.append(Problem(str(eid), case_id, agent, "a transcript line names no stored episode of this run"))
            continue
        if eid in seen:
            problems.append(Problem(eid, case_id, agent, "the episode has more than one transcript line"))
            continue
        seen.add(eid)
        claimed = line.get("grade") if isinstance(line.get("grade"), dict) else {}
        why = differs(claimed, fresh[eid], whole=True)
        if why:
            problems.append(Problem(eid, case_id, agent, "the transcript line " + why.removeprefix("the kept grade ")))
        wrong = _claims_beside_the_grade(line, rows[eid], fresh[eid], run_id)
        if wrong:
            problems.append(Problem(eid, case_id, agent, f"the transcript line says {wrong}"))
        if line.get("ledger") != store.entries(eid):
            problems.append(Problem(eid, case_id, agent, "the transcript line's ledger is not the stored ledger"))
        log = store.transcript(eid)
        if log is not None and line.get("messages") != log.get("messages"):
            problems.append(Problem(eid, case_id, agent, "the transcript line's messages are not the stored ones"))
        for key, none in (("turns", 0), ("counts", {}), ("usage", {}), ("tool_calls", []), ("settings", {})):
            if log is not None and line.get(key) != log.get(key, none):  # (a resumed run's tables read `counts`)
                problems.append(Problem(eid, case_id, agent, f"the transcript line's {key} are not the stored ones"))
    for eid, row in rows.items():
        if eid not in seen:
            problems.append(Problem(eid, row["case_id"], row["agent"], f"the episode has no line in {path.name}"))
    return problems