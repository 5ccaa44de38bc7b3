"""Many rollouts of a model on many cases, concurrently (asyncio), each written as one JSONL line.

A run lives in runs/<run-id>/: `run.json` (what was asked: model, settings, cases, rollouts)
and `transcripts.jsonl` (one line per finished rollout: messages, tool calls, ledger, grade,
timings, token usage). Lines are appended as rollouts end, so an interrupted run keeps what
it did; re-running with the same run id redoes only the rollouts with no line yet, and the
ones that ended on an API error or timeout (a server fault, not the model's; the newer line
supersedes the older). A rollout that ran out of turns is the model's result and is kept.
"""
from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..grader import grade
from ..tools import Episode
from ..world import PreparedCase
from .agent import API_ERROR, TIMEOUT, ModelAgent, ModelSettings, make_client, to_json

TRANSCRIPTS, META = "transcripts.jsonl", "run.json"
REDONE_ON_RESUME = (API_ERROR, TIMEOUT)
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# settings that change what a rollout means: a resumed run must not mix them
BINDING = ("model", "base_url", "temperature", "max_turns", "max_tokens")


# a run allocates many short-lived objects (messages, requests, rows); with CPython's default of a
# young-generation collection every 700 allocations the collector took ~0.15-0.45 ms of CPU per
# rollout (a full collection of the long-lived heap every other run), against ~0.05 ms at 10000
GEN0_THRESHOLD = 10_000


@contextmanager
def fewer_collections():
    """Young-generation collections at most every GEN0_THRESHOLD allocations during a run; the
    process's thresholds are put back after it."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], GEN0_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class RunError(ValueError):
    """A run directory that cannot be used (bad id, corrupt transcript, other settings); one line."""


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
    """Every rollout line; a torn last line (the process died mid-write) is dropped and redone."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: cannot read ({exc})")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("key"), str):
                raise ValueError("not a rollout record")
        except (ValueError, RecursionError) as exc:
            if n == len(lines):
                continue
            raise RunError(f"{path}:{n}: not a rollout record ({exc})")
        records.append(record)
    return records


def drop_torn_tail(path: Path) -> None:
    """Cut a half-written last line (a process killed mid-write) so the next line starts clean.

    read_transcripts skips such a line; appending after it would glue the next record onto it
    and make the file unreadable on the following resume."""
    if not path.exists():
        return
    with path.open("rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


def latest(records: list[dict]) -> dict[str, dict]:
    """The last record per rollout key (a redone rollout supersedes its earlier line)."""
    return {r["key"]: r for r in records}


def pending(cases: list[dict], rollouts: int, done: dict[str, dict]) -> list[tuple[dict, int]]:
    out = []
    for case in cases:
        for i in range(rollouts):
            record = done.get(rollout_key(case["case_id"], i))
            if record is None or record.get("end_reason") in REDONE_ON_RESUME:
                out.append((case, i))
    return out


def _check_meta(run_dir: Path, settings: ModelSettings, rollouts: int) -> None:
    meta_path = run_dir / META
    wanted = {k: getattr(settings, k) for k in BINDING}
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            before = meta["settings"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunError(f"{meta_path}: not a run description ({exc})")
        for key, value in wanted.items():
            if before.get(key) != value:
                raise RunError(f"run {run_dir.name!r} was made with {key}={before.get(key)!r}, not {value!r}; "
                               f"use another --run-id")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"run_id": run_dir.name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "settings": settings.public(), "rollouts": rollouts}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _record(run_id, case, index, settings, convo, episode, g, started, wall, grade_seconds) -> dict:
    return {
        "run_id": run_id, "key": rollout_key(case["case_id"], index), "case_id": case["case_id"],
        "family": case["family"], "rollout": index, "model": settings.model,
        "finished": convo.finished, "end_reason": convo.end_reason, "error": convo.error,
        "reward": g["reward"], "turns": convo.turns, "counts": convo.counts, "usage": convo.usage,
        "timings": {"started": started, "wall_seconds": round(wall, 6),
                    "model_seconds": round(convo.model_seconds, 6), "tool_seconds": round(convo.tool_seconds, 6),
                    "grade_seconds": round(grade_seconds, 6)},
        "grade": g, "tool_calls": convo.tool_calls, "messages": convo.messages,
        "ledger": episode.ledger.entries, "settings": settings.public(),
    }


def transcript_line(record: dict, encoded: list[str]) -> str:
    """`json.dumps(record, default=str)`, reusing the JSON of the messages the agent already encoded
    for its requests (`encoded[i]` is `json.dumps(record["messages"][i], default=str)`): the
    conversation is most of a record's bytes, so it is not encoded a second time."""
    keys = list(record)
    messages = record["messages"]
    if "messages" not in keys[1:-1] or len(encoded) > len(messages):
        return to_json(record)
    at = keys.index("messages")
    before = to_json({k: record[k] for k in keys[:at]})
    after = to_json({k: record[k] for k in keys[at + 1:]})
    parts = encoded + [to_json(m) for m in messages[len(encoded):]]
    return f'{before[:-1]}, "messages": [{", ".join(parts)}], {after[1:]}'


async def one_rollout(agent: ModelAgent, client, prepared: PreparedCase, index: int,
                      run_id: str) -> tuple[dict, str]:
    """Play one episode; its transcript record and that record's JSON line (the episode is closed)."""
    started = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    t0 = time.perf_counter()
    episode = Episode(prepared)
    try:
        convo = await agent.converse(episode.call, client)
        t1 = time.perf_counter()
        g = grade(episode)
        t2 = time.perf_counter()
        record = _record(run_id, prepared.case, index, agent.settings, convo, episode, g,
                         started, t2 - t0, t2 - t1)
        return record, transcript_line(record, convo.encoded)
    finally:
        episode.close()


async def run_rollouts(cases: list[dict], settings: ModelSettings, rollouts: int, concurrency: int,
                       run_dir: Path, on_done: Callable[[dict], None] | None = None) -> dict:
    """Run (or resume) a run; returns {"records": latest record per key in case order, "new": n, "kept": n}."""
    check_run_id(run_dir.name)
    _check_meta(run_dir, settings, rollouts)
    path = run_dir / TRANSCRIPTS
    done = latest(read_transcripts(path))
    todo = pending(cases, rollouts, done)
    kept = len(cases) * rollouts - len(todo)
    queue: asyncio.Queue = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    prepared: dict[str, PreparedCase] = {}
    agent = ModelAgent(**settings.public())
    client = make_client(settings)

    async def worker(out):
        while True:
            try:
                case, index = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            cid = case["case_id"]
            if cid not in prepared:
                prepared[cid] = PreparedCase(case)
            record, line = await one_rollout(agent, client, prepared[cid], index, run_dir.name)
            out.write(line + "\n")
            out.flush()
            done[record["key"]] = record
            if on_done:
                on_done(record)

    drop_torn_tail(path)
    try:
        with path.open("a", encoding="utf-8") as out, fewer_collections():
            await asyncio.gather(*(worker(out) for _ in range(max(1, min(concurrency, len(todo) or 1)))))
    finally:
        await client.close()
    records = [done[k] for case in cases for i in range(rollouts)
               if (k := rollout_key(case["case_id"], i)) in done]
    return {"records": records, "new": len(todo), "kept": kept}
