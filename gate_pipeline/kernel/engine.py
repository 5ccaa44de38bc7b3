"""The one episode engine: every surface that plays an episode plays it here.

A `Session` is one episode of one prepared case: every action goes through the one action parser
(`actions.py`) into the tools of the case's suite (its `Episode`), each step gets its reward under
the session's reward mode (`rewards.py`), and `finish` grades the episode in the one grader
(`grading.py`, with the suite's rubric) and returns an `EpisodeResult` (`records.py`). It is driven either step by step
(`Session.step`: the gymnasium env, the verifiers env, `gate replay`) or by an agent
(`play` / `play_async`: `gate report`, `gate attacks`, the Dagster jobs, `gate run`), which
builds a fresh agent from its `AgentSpec` for every episode, hands the case to oracles only,
and turns whatever the agent raises into a failed episode.

Observers (`Sink`s) see each ledger entry as it is appended and the result at the end: the
run store (`store.StoreSink`), the Dagster tool bridge, the transcript writer. They never
reach into the episode's database.
"""
from __future__ import annotations

import gc
import hashlib
import multiprocessing
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable

from .actions import parse_action
from .agents import AgentSpec, AgentUnfinished, resolve_agent, unique_agents
from .cases import Case, CaseLines, valid_text
from .compile_check import warm as warm_compile_checks
from .errors import NoRoom
from .grading import grade
from .records import ABANDONED, AGENT_ERROR, NO_REPORT, REPORTED, EpisodeResult, Grade
from .rewards import REWARD_MODES, make_shaper
from .sandbox import gates_own, raise_swallowed
from .suite import Suite, suites
from .workers import WorkerDied, WorkerTraceback, play_forked  # noqa: F401 - the two errors a batch raises, named here too
from .world import PreparedCase

OVER = "the episode is over; start a new one"


@dataclass(frozen=True, slots=True)
class EpisodeStart:
    """What a sink learns when an episode opens."""
    episode_id: str
    case: Case
    agent: str
    options: dict
    run_id: str
    rollout: int
    started_at: float
    prepared: PreparedCase | None = None  # what the episode plays on (row counts, the suite), for gate's own sinks
    agent_name: str = ""  # the name the agent was resolved by (`agent` is its identity: a model agent's model)


class Sink:
    """An observer of episodes. Override what you need: `entry` is called only for sinks that set
    `wants_entries`; `wants_warehouse` asks the engine to put the final database image in the result."""
    wants_entries = False
    wants_warehouse = False

    def start(self, episode: EpisodeStart) -> None:
        pass

    def entry(self, episode_id: str, entry: dict) -> None:
        pass

    def end(self, result: EpisodeResult) -> None:
        pass

    def fail(self, episode_id: str, reason: str) -> None:
        """The machine failed the episode (`NoRoom`): it is over with no result, and no `end` follows."""
        pass


@dataclass(slots=True)
class Step:
    """One step's outcome: the tool's JSON value, its reward, and whether the episode is over.

    `parts` holds the dense mode's layers for a shaped call; `grade` is set on the step that
    ended the episode."""
    result: object
    reward: float
    terminated: bool
    truncated: bool
    parts: dict | None = None
    grade: Grade | None = None


class _Tools:
    """What an agent gets: `tools(name, **args)`, `tools.act(action)`, `tools.episode_seed`, and the
    episode's `suite` (its vocabulary and tools, no labels) with the `tool_names` it offers."""
    __slots__ = ("_session",)

    def __init__(self, session: "Session"):
        self._session = session

    def __call__(self, name, **args):
        return self._session.call(name, args)

    def act(self, action):
        return self._session.step(action).result

    @property
    def episode_seed(self) -> int:
        return self._session.episode_seed

    @property
    def suite(self) -> Suite:
        return self._session.prepared.suite

    @property
    def tool_names(self) -> tuple[str, ...]:
        return self._session.prepared.suite.tool_names


class Session:
    """One episode of one prepared case, under a reward mode, observed by sinks.

    `stop_at_report` ends the episode at the first accepted report (step-driven use: an env);
    an agent's episode goes on until the agent returns, so calls after a report still count.
    `max_steps` truncates a step-driven episode.
    """

    def __init__(self, prepared: PreparedCase, agent: str = "", *, options: dict | None = None,
                 sinks: Iterable[Sink] = (), reward: str = "terminal", run_id: str = "", rollout: int = 0,
                 stop_at_report: bool = False, max_steps: int | None = None, agent_name: str = ""):
        self.prepared = prepared
        self.agent = agent
        self.sinks = tuple(sinks)
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {list(REWARD_MODES)}, not {reward!r}")
        self.reward_mode = reward
        self.stop_at_report = stop_at_report
        self.max_steps = max_steps
        self.run_id, self.rollout = run_id, rollout
        self.episode_id = os.urandom(16).hex()  # 128 random bits, as 32 hex digits
        self.started_at = time.time()
        self._t0 = time.perf_counter()
        # with nobody watching entries as they are written, the chain is hashed once, when first read
        self.watchers = tuple(sink for sink in self.sinks if sink.wants_entries)
        # a shaper that needs no episode is made first: what it reads of the case (the dense reward's gold rows) is
        # read before the episode borrows the case's database, not from a copy of it
        early = reward != "potential"
        shaper = make_shaper(reward, prepared) if early else None
        self.episode = prepared.suite.episode(prepared, self._to_sinks if self.watchers else None,
                                              deferred_ledger=not self.watchers)
        self.rewards: list[float] = []
        self.report_index: int | None = None
        self.result: EpisodeResult | None = None
        self._failure_told = False  # whether the sinks were told the machine failed the episode
        try:  # whatever fails from here, the episode gives back what it borrowed
            self.shaper = shaper if early else make_shaper(reward, prepared, self.episode)
            if self.sinks:
                start = EpisodeStart(self.episode_id, prepared.case, agent, dict(options or {}), run_id, rollout,
                                     self.started_at, prepared, agent_name or agent)
                for sink in self.sinks:
                    sink.start(start)
        except BaseException:
            self.episode.close()
            raise

    def _to_sinks(self, entry: dict) -> None:
        for sink in self.watchers:
            sink.entry(self.episode_id, entry)

    @property
    def tools(self) -> _Tools:
        """What an agent plays through (made on demand: the session keeps no reference to it)."""
        return _Tools(self)

    @property
    def turn(self) -> int:
        return len(self.rewards)

    @property
    def failure(self) -> NoRoom | None:
        """The machine's failure of the episode (no room for its database's pages): over, with no result. The
        episode keeps it, whether a tool call or the grade found it."""
        return self.episode.machine_failure

    @property
    def done(self) -> bool:
        """Whether the episode is over: graded, or failed by the machine (`failure`)."""
        return self.result is not None or self.failure is not None

    @property
    def reported(self) -> bool:
        return self.report_index is not None

    @property
    def episode_seed(self) -> int:
        """A number fixed by the case, for agents that draw at random (never by play order)."""
        return int.from_bytes(hashlib.sha256(self.prepared.case_id.encode("utf-8", "surrogatepass")).digest()[:8],
                              "big")

    # -- acting ---------------------------------------------------------------------------------
    def call(self, tool, args: dict):
        """One tool call with its arguments (an agent's `tools(name, **args)`); the tool's JSON value."""
        if self.done:
            return {"error": OVER}
        result = self._call(tool, args)
        self._account(tool, args, result)
        return result

    def step(self, action) -> Step:
        """One action in any spelling the action parser accepts. Nothing the action holds makes it raise; the
        machine can (`NoRoom`: no room for the case's database, not the agent's doing, and the episode is over)."""
        if self.done:  # as it ended: cut off at its step limit (truncated), else terminated
            truncated = self.report_index is None and self.max_steps is not None and self.turn >= self.max_steps
            return Step({"error": OVER}, 0.0, not truncated, truncated)
        parsed = parse_action(action)
        if parsed.problem:
            result = self.episode.refuse(parsed)
        else:
            result = self._call(parsed.tool, parsed.args)
        parts = self._account(parsed.tool, parsed.args, result)
        reward = self.rewards[-1]
        if self.stop_at_report and self.report_index is not None:
            finished = self.finish()
            return Step(result, reward + finished.grade.reward, True, False, parts, finished.grade)
        if self.max_steps is not None and self.turn >= self.max_steps:  # cut off: finishing pays what shaping
            finished = self.finish()  # owes an episode that ends unreported (-Phi) into this step's reward
            return Step(result, self.rewards[-1], False, True, parts, finished.grade)
        return Step(result, reward, False, False, parts)

    def _call(self, tool, args):
        try:
            return self.episode.call(tool, args)
        except BaseException:  # NoRoom, or Ctrl-C raised in its place: the machine's failure (the episode keeps it)
            if self.failure is not None:  # is over, and closed now (its database freed)
                self._failed()
            raise

    def _account(self, tool, args, result) -> dict | None:
        """Record the call's step reward (nothing is shaped after the first accepted report)."""
        if self.report_index is not None:
            self.rewards.append(0.0)
            return None
        parts = self.shaper.shape(tool, args, result) if self.shaper is not None else None
        self.rewards.append(parts["step"] if parts is not None else 0.0)
        if self.episode.world.report is not None:
            self.report_index = len(self.rewards) - 1
        return parts

    # -- ending ---------------------------------------------------------------------------------
    def finish(self, error: str = "", end_reason: str = "", agent_log: dict | None = None) -> EpisodeResult:
        """Grade the episode (0 with the reason when `error` is set), close it, tell the sinks."""
        if self.result is not None:
            return self.result
        if self.failure is not None:  # failed by the machine (not the agent): not graded, no result; closed, it stays so
            self._failed()
            raise_swallowed()  # Ctrl-C that came while gate's statements failed goes first
            again = NoRoom(str(self.failure))  # a new one, with the first's notes: no traceback piled on the first's
            for note in getattr(self.failure, "__notes__", ()):
                again.add_note(note)
            raise again
        if not end_reason:
            end_reason = AGENT_ERROR if error else REPORTED if self.report_index is not None else NO_REPORT
        try:
            try:
                with gates_own():  # the grade's own statements: a failure is Ctrl-C's, perhaps
                    g = grade(self.episode, error)
            except sqlite3.Error as exc:
                room = self.episode.world.no_room(exc)
                if room is None:
                    raise
                self.episode.machine_failure = room
                self._failed()
                raise room from None
            except NoRoom as exc:
                self.episode.machine_failure = exc
                self._failed()
                raise
            if self.report_index is not None:
                self.rewards[self.report_index] += g.reward
            elif self.shaper is not None and self.rewards:
                self.rewards[-1] += self.shaper.close()
            wants = any(sink.wants_warehouse for sink in self.sinks)
            warehouse = self.episode.world.image() if wants else None
        finally:
            self.episode.close()
        case = self.prepared.case
        ledger = self.episode.ledger
        self.result = EpisodeResult(
            self.episode_id, case.case_id, case.family, self.agent, g, ledger if ledger.deferred else ledger.entries,
            end_reason, error, self.run_id, self.rollout, self.rewards, agent_log, warehouse, self.started_at,
            time.perf_counter() - self._t0)
        for sink in self.sinks:
            sink.end(self.result)
        raise_swallowed()  # Ctrl-C while the grade's statements ran, which finished: the episode is recorded
        return self.result

    def _failed(self) -> None:
        """Close the episode the machine failed and tell the sinks so, once (closing again is nothing). A sink that
        cannot record it (its store on the same full disk) does not hide the failure nor keep it from the sinks
        after it: what it raised is a note on the failure."""
        self.episode.close()
        if self._failure_told:
            return
        self._failure_told = True
        failure = self.failure
        assert failure is not None
        for sink in self.sinks:
            try:
                sink.fail(self.episode_id, str(failure))
            except Exception as exc:  # noqa: BLE001 - noted on the failure, which is what is raised
                failure.add_note(f"{type(sink).__name__} could not record the failure: {type(exc).__name__}: {exc}")

    def close(self, why: str) -> None:
        """End the episode however it stands, quietly (an environment's reset or close): graded, it stays so; failed
        by the machine, it is closed and its sinks told, once; in play, it is cut off now (`abandon`, graded 0)."""
        if self.result is None:
            try:
                self.abandon(why)
            except NoRoom:
                pass

    def abandon(self, why: str) -> EpisodeResult:
        """End an episode that was cut off (an interrupt, a crash around it): graded 0 with `why`."""
        return self.finish(why, ABANDONED)


# -- agent-driven episodes ----------------------------------------------------------------------

def spec_of(agent) -> AgentSpec:
    return agent if isinstance(agent, AgentSpec) else resolve_agent(agent)


def _open(prepared: PreparedCase, spec: AgentSpec, sinks, reward, run_id, rollout) -> Session:
    return Session(prepared, spec.identity, options=spec.options, sinks=sinks, reward=reward, run_id=run_id,
                   rollout=rollout, agent_name=spec.name)


def _failure(exc: BaseException) -> tuple[str, str]:
    """(the error text, the end reason) of an agent's failure; the text made storable (`valid_text`): an agent's
    exception may say anything."""
    if isinstance(exc, AgentUnfinished):
        return valid_text(str(exc) or exc.end_reason), exc.end_reason
    return valid_text(f"{type(exc).__name__}: {exc}"), AGENT_ERROR


def _oracle_case(spec: AgentSpec, prepared: PreparedCase) -> dict | None:
    """The case's JSON object, truth labels included, for an agent whose class says it is an oracle (`AgentSpec.oracle`,
    read before any agent was built); else None."""
    return prepared.case.data if spec.oracle is True else None  # type: ignore[return-value]


def prepare(case: Case) -> PreparedCase:
    """The prepared case of the case's suite (its database, listing, profiles, correct mart)."""
    return suites.get(case.suite).prepared_case(case)


def _log(agent) -> dict | None:
    log = getattr(agent, "episode_log", None)
    return log() if callable(log) else None


class _AgentRun:
    """One agent's episode as `_guarded` watches it: the agent once built, the result once finished."""
    __slots__ = ("built", "result")

    def __init__(self):
        self.built = None
        self.result: EpisodeResult | None = None


@contextmanager
def _guarded(session: Session):
    """Finish the session when the block ends: graded, or failed with the reason when the agent raised
    (the run goes on); an interrupt records the episode as cut off, then goes through."""
    run = _AgentRun()
    try:
        yield run
    except Exception as exc:  # an agent's bug, or an agent that gave up: the episode fails, the run goes on
        error, end_reason = _failure(exc)
        run.result = session.finish(error, end_reason, _log(run.built))
        return
    except BaseException:  # an interrupt (or a cancelled task): record the episode as cut off (unless the machine
        session.close("interrupted before the agent finished")  # failed it first), then let it through
        raise
    run.result = session.finish(agent_log=_log(run.built))


def play(prepared: PreparedCase, agent, *, sinks: Iterable[Sink] = (), reward: str = "terminal",
         run_id: str = "", rollout: int = 0) -> EpisodeResult:
    """One episode of `agent` (an AgentSpec, or a name) on `prepared`, start to grade."""
    spec = spec_of(agent)
    session = _open(prepared, spec, sinks, reward, run_id, rollout)
    with _guarded(session) as run:
        run.built = spec.build()
        run.built.play(session.tools, _oracle_case(spec, prepared))
    assert run.result is not None
    return run.result


async def play_async(prepared: PreparedCase, agent, *, sinks: Iterable[Sink] = (), reward: str = "terminal",
                     run_id: str = "", rollout: int = 0) -> EpisodeResult:
    """`play` for agents that wait on the network (`play_async(tools, case)`, e.g. a model)."""
    spec = spec_of(agent)
    session = _open(prepared, spec, sinks, reward, run_id, rollout)
    with _guarded(session) as run:
        run.built = built = spec.build()
        case = _oracle_case(spec, prepared)
        if hasattr(built, "play_async"):
            await built.play_async(session.tools, case)
        else:
            built.play(session.tools, case)
    assert run.result is not None
    return run.result


def replay(prepared: PreparedCase, actions: list, *, reward: str = "terminal",
           sinks: Iterable[Sink] = ()) -> tuple[list, EpisodeResult]:
    """Apply recorded actions in order to a fresh episode (refused ones too; nothing stops early):
    the tool results, and the finished episode."""
    session = Session(prepared, "replay", sinks=sinks, reward=reward)
    results = [session.step(action).result for action in actions]
    return results, session.finish()


# playing many episodes allocates many short-lived objects (rows, dicts, results), and reading a case file many
# long-lived ones: at CPython's default of a young-generation collection every 700 allocations the collector
# took ~0.15-0.45 ms of CPU per model rollout against ~0.05 ms at 10000 (benchmarks/bench_rollouts.py), and
# 0.14 ms per careful-sql episode of `gate report` over 320 cases (most of it full collections walking the
# cases read) against 0.03 ms (docs/performance.md)
GEN0_THRESHOLD = 10_000


class _FewerCollections:
    """The collector's thresholds are the process's: the first of the blocks that overlap (in one thread,
    nested, or in several) raises them, the last to end puts back what the first found."""

    def __init__(self):
        self.lock = threading.Lock()
        self.holders = 0
        self.before = gc.get_threshold()
        # a process forked while another thread held the lock would find it held for good: the child, one
        # thread, takes a new one (the thresholds and holders it inherits stand as the parent's were)
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()

    @contextmanager
    def block(self):
        with self.lock:
            if not self.holders:
                self.before = gc.get_threshold()
                gc.set_threshold(max(self.before[0], GEN0_THRESHOLD), *self.before[1:])
            self.holders += 1
        try:
            yield
        finally:
            with self.lock:
                self.holders -= 1
                if not self.holders:
                    gc.set_threshold(*self.before)


_COLLECTIONS = _FewerCollections()


def fewer_collections():
    """Young-generation collections at most every GEN0_THRESHOLD allocations while a batch plays (a context
    manager); the process's thresholds are put back when the last such block ends, whichever thread ends it."""
    return _COLLECTIONS.block()


def play_cases(cases: Iterable[Case] | CaseLines, agents: list, *, sinks: Iterable[Sink] = (),
               reward: str = "terminal", run_id: str = "", progress: Callable[[], None] | None = None,
               workers: int = 1) -> dict[str, list[EpisodeResult]]:
    """Every agent on every case, in case order: {agent identity: [result per case]}.

    Each case is prepared once (its database image, profiles, correct mart) and every agent's
    episode opens a private copy of it (or borrows it, as a suite's world may). With `workers` > 1 and no sinks, the cases are played
    in that many forked processes (where the platform forks); the results are the same, in the
    same order, because every episode depends on its case alone. Given a case file's lines not yet
    parsed (`CaseLines`), each worker parses and checks its share of them; played in one process, they
    are parsed first, as `read_cases` would."""
    specs = unique_agents([spec_of(a) for a in agents])
    sinks = tuple(sinks)
    if not isinstance(cases, CaseLines):
        cases = list(cases)
    count = len(cases)
    with fewer_collections():
        if workers > 1 and not sinks and count > 1 and "fork" in multiprocessing.get_all_start_methods():
            return play_forked(play_cases, cases, specs, reward, run_id, progress, min(workers, count))
        warm_compile_checks(1)  # its child starts while the cases are read and prepared, not at the first subquery
        if isinstance(cases, CaseLines):
            cases = cases.cases()
        out: dict[str, list[EpisodeResult]] = {spec.identity: [] for spec in specs}
        for case in cases:
            prepared = prepare(case)
            try:
                for spec in specs:
                    out[spec.identity].append(play(prepared, spec, sinks=sinks, reward=reward, run_id=run_id))
            finally:
                prepared.close()
            if progress is not None:
                progress()
        return out
