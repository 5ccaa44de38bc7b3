"""Cases played in forked worker processes (`engine.play_cases(..., workers=N)`, `gate report --workers N`): the
same results as one process, whatever the case file or the agent does, and no worker, pipe or descriptor left
behind. (Each test here is an outside review's finding; tests/test_hostile_input.py holds the earlier ones.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate_pipeline.kernel.cases import CaseError, CaseLines, read_cases
from gate_pipeline.kernel.engine import play_cases

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
V2 = ROOT / "cases" / "v2" / "train_procedural.jsonl"
GATE = str(Path(sys.executable).parent / "gate")
LINUX = sys.platform.startswith("linux")

AGENTS = '''
import os, signal, sys, time
from gate_pipeline.kernel.agents import resolve_agent

def naive(tools, case=None):
    resolve_agent("naive").build().play(tools, case)

class LambdaLog:
    def play(self, tools, case=None):
        naive(tools, case)
    def episode_log(self):
        return {"kept": 1, "made by": lambda: 1}

class OddLogs:
    """Logs that do not pickle, each in another way, and some JSON cannot write either."""
    def play(self, tools, case=None):
        naive(tools, case)
    def episode_log(self):
        import ctypes
        cyclic = {"f": lambda: 1}
        cyclic["self"] = cyclic
        deep = []
        for _ in range(100_000):
            deep = [deep]
        class NoStr:
            def __str__(self):
                raise RuntimeError("no str")
            __repr__ = __str__
        nested = []
        for _ in range(800):  # pickles in one process, not in a worker's deeper stack; nor does its JSON copy
            nested = [nested]
        kind = os.environ.get("GATE_TEST_LOG", "pointer")
        return {"pointer": {"p": ctypes.pointer(ctypes.c_int(1))}, "mixed keys": {("a", 1): 1, "f": lambda: 1},
                "cycle": cyclic, "deep": {"d": deep, "f": lambda: 1}, "long int": {"n": 10 ** 5000, "f": lambda: 1},
                "no str": {"x": NoStr()}, "nested": {"n": nested}, "exits": {"x": ExitsWhenPickled()},
                "flaky": {"x": Flaky()}}[kind]

class ExitsWhenPickled:
    def __reduce__(self):
        raise SystemExit(7)

class Flaky:
    """Pickles to something that reads back the first time, and to what does not after."""
    calls = 0
    def __reduce__(self):
        Flaky.calls += 1
        return (str, ("ok",)) if Flaky.calls == 1 else (TwoArgs, (3,))

class TwoArgs(Exception):
    def __init__(self, code, detail):
        super().__init__(code)

class UnreadableLog:
    """A log that pickles but does not unpickle (an exception whose __init__ takes two arguments)."""
    def play(self, tools, case=None):
        naive(tools, case)
    def episode_log(self):
        return {"error": TwoArgs(3, "x")}

class ListsItsDescriptors:
    def play(self, tools, case=None):
        with open(os.environ["GATE_TEST_PIDS"] + ".fds", "a") as fh:
            for fd in os.listdir("/proc/self/fd"):
                try:
                    fh.write(os.readlink(f"/proc/self/fd/{fd}") + "\\n")
                except OSError:
                    pass
        naive(tools, case)

class ClosesItsPipe:
    def play(self, tools, case=None):
        os.closerange(3, 4096)
        time.sleep(30)

class DiesSendingWithAGrandchild:
    """Forks a process that keeps the worker's pipe open, then dies halfway through writing its results."""
    def play(self, tools, case=None):
        naive(tools, case)
        if os.fork() == 0:
            os.setsid()
            for fd in (0, 1, 2):
                os.dup2(os.open(os.devnull, os.O_RDWR), fd)
            with open(os.environ["GATE_TEST_PIDS"], "a") as fh:
                fh.write(f"{os.getpid()}\\n")
            time.sleep(30)
            os._exit(0)
        from multiprocessing import connection
        send = connection.Connection._send
        def half(self, buf, write=os.write):
            if len(buf) > 1_000_000:
                write(self._handle, bytes(buf[: len(buf) // 2]))
                os.kill(os.getpid(), signal.SIGKILL)
            return send(self, buf, write)
        connection.Connection._send = half
    def episode_log(self):
        return {"big": "x" * 4_000_000}

class Interrupts:
    def play(self, tools, case=None):
        raise KeyboardInterrupt

class Exits:
    def play(self, tools, case=None):
        os._exit(3)

class IgnoresTerm:
    def play(self, tools, case=None):
        signal.signal(signal.SIGTERM, lambda *_: None)
        with open(os.environ["GATE_TEST_PIDS"], "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        time.sleep(30)
        naive(tools, case)

class LeavesAGrandchild:
    def play(self, tools, case=None):
        if os.fork() == 0:
            os.setsid()
            for fd in (0, 1, 2):  # not gate's output, which its caller reads to the end
                os.dup2(os.open(os.devnull, os.O_RDWR), fd)
            with open(os.environ["GATE_TEST_PIDS"], "a") as fh:
                fh.write(f"{os.getpid()}\\n")
            time.sleep(30)
            os._exit(0)
        time.sleep(0.3)
        os._exit(9)
'''


@pytest.fixture
def agents(tmp_path):
    """An environment whose PYTHONPATH holds the module `hostile_agents` (AGENTS), and a file for pids."""
    (tmp_path / "hostile_agents.py").write_text(AGENTS)
    pids = tmp_path / "pids"
    pids.write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "GATE_TEST_PIDS": str(pids)}
    yield env, pids
    for pid in pids.read_text().split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def _cases(tmp_path, count: int) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(EVAL.read_text().splitlines()[:count]) + "\n")
    return path


def _report(path: Path, agent: str, workers: int, env, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([GATE, "report", "--cases", str(path), "--agents", agent, "--workers", str(workers), "--json"],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("source,path,first,then", [
    (EVAL, ("limits", "max_amount"), 1, True),
    (V2, ("row_quarantine", "max_rows"), 5, 5.0),
], ids=["classic: true after 1", "v2: 5.0 after 5"])
def test_a_contract_equal_in_value_to_the_one_before_but_not_in_type_is_checked(tmp_path, source, path, first, then):
    """A case whose contract equals the one of the case before it is not checked again; equal was Python's `==`, for
    which `true == 1` and `5.0 == 5`: a contract refused on its own line was accepted after an equal-valued one (and,
    with workers, accepted or not by how deep in its stack a worker re-read the line before)."""
    lines = source.read_text().splitlines()[:2]
    cases = [json.loads(line) for line in lines]
    for case, value in zip(cases, (first, then)):
        case["contract"][path[0]][path[1]] = value
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(cases[1]) + "\n")
    with pytest.raises(CaseError) as refused:
        read_cases(alone)
    both = tmp_path / "both.jsonl"
    both.write_text("".join(json.dumps(c) + "\n" for c in cases))
    with pytest.raises(CaseError) as after:
        read_cases(both)
    assert str(refused.value).startswith(f"{alone}:1 ") and str(after.value).startswith(f"{both}:2 "), after.value
    assert str(after.value)[len(f"{both}:2"):] == str(refused.value)[len(f"{alone}:1"):]
    for workers in (1, 2):
        with pytest.raises(CaseError) as shared:
            play_cases(CaseLines.read(both), ["naive"], workers=workers)
        assert str(shared.value) == str(after.value)


def test_a_contract_before_a_share_is_read_as_deep_as_anywhere(tmp_path):
    """A worker re-reads the line before its share for its contract; it did so with `json.loads`, which stops at the
    recursion limit counted from the worker's deeper stack: a line nested 975 deep was then no contract, and the
    share's first contract was checked where the whole file's reading skips it. Both now read it alike."""
    from gate_pipeline.kernel import cases as cases_module
    lines = EVAL.read_text().splitlines()[:2]
    first = json.dumps(json.loads(lines[0]))
    at = first.index('"truth": {') + len('"truth": {')
    text = first[:at] + '"deep": ' + "[" * 975 + "]" * 975 + ", " + first[at:] + "\n" + lines[1] + "\n"
    checked = []
    real = cases_module.load_case

    def counting(obj, where="case", contract_checked=False):
        checked.append(contract_checked)
        return real(obj, where, contract_checked)

    def deep(levels, fn):  # a reader 400 frames deeper than this test
        return fn() if levels == 0 else deep(levels - 1, fn)

    try:
        cases_module.load_case = counting
        whole = CaseLines(text, "x.jsonl")
        whole.parsed()
        lines_read = CaseLines(text, "x.jsonl")
        deep(400, lambda: lines_read.share(1, 2))
    finally:
        cases_module.load_case = real
    assert checked == [False, True, True]


def test_an_agent_log_that_does_not_pickle_plays_as_in_one_process(tmp_path, agents):
    """A worker sends its results to the parent pickled: an agent whose `episode_log()` held a lambda played in one
    process and ended `gate report --workers 2` with a 40-line traceback. Such a log is sent as the run store keeps
    it (JSON, other values as text)."""
    env, _ = agents
    path = _cases(tmp_path, 6)
    one = _report(path, "hostile_agents:LambdaLog", 1, env)
    assert one.returncode == 0, one.stderr[-2000:]
    for workers in (2, 3):
        many = _report(path, "hostile_agents:LambdaLog", workers, env)
        assert (many.returncode, many.stdout, many.stderr) == (0, one.stdout, one.stderr), many.stderr[-2000:]


def test_an_agent_log_that_does_not_pickle_comes_back_as_the_store_keeps_it(tmp_path, agents, monkeypatch):
    env, _ = agents
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = read_cases(_cases(tmp_path, 4))
    logs = [r.agent_log for r in play_cases(cases, ["hostile_agents:LambdaLog"], workers=2)["hostile_agents:LambdaLog"]]
    assert len(logs) == 4
    for log in logs:
        assert log["kept"] == 1 and log["made by"].startswith("<function LambdaLog.episode_log.<locals>.<lambda>")


@pytest.mark.parametrize("kind", ["pointer", "mixed keys", "cycle", "deep", "long int", "no str", "nested", "exits",
                                  "flaky"])
def test_a_log_that_neither_pickles_nor_writes_as_json_plays_as_in_one_process(tmp_path, agents, kind):
    """Pickling a log raises more than PicklingError (a ctypes pointer: ValueError), and a log may not be written as
    JSON either (keys of two types, a cycle, nesting too deep): each ended a batch in workers with a traceback."""
    env, _ = agents
    env = {**env, "GATE_TEST_LOG": kind}
    path = _cases(tmp_path, 4)
    one = _report(path, "hostile_agents:OddLogs", 1, env)
    assert one.returncode == 0, one.stderr[-2000:]
    many = _report(path, "hostile_agents:OddLogs", 2, env)
    assert (many.returncode, many.stdout, many.stderr) == (0, one.stdout, one.stderr), many.stderr[-2000:]


def test_a_log_that_pickles_but_does_not_unpickle_ends_the_batch_as_one_process_does(tmp_path, agents):
    """A log holding an exception whose __init__ takes two arguments pickles in the worker and fails to unpickle in
    the parent: that was a raw TypeError traceback, then one line asking for --workers 1. The worker reads each log
    back before it sends it, and sends one that does not read back as the run store keeps it."""
    env, _ = agents
    path = _cases(tmp_path, 4)
    one = _report(path, "hostile_agents:UnreadableLog", 1, env)
    assert one.returncode == 0, one.stderr[-2000:]
    many = _report(path, "hostile_agents:UnreadableLog", 2, env)
    assert (many.returncode, many.stdout, many.stderr) == (0, one.stdout, one.stderr), many.stderr[-2000:]


def test_a_watcher_that_cannot_start_is_one_line_and_leaves_nothing(monkeypatch):
    """The parent watches each worker from a thread of its own: a thread that could not start (no memory for its
    stack) was a RuntimeError traceback, then 'cannot join thread before it is started', with every pipe, pidfd and
    worker left behind."""
    import threading

    from gate_pipeline.kernel.errors import GateError
    started = threading.Thread.start
    watchers: list[None] = []

    def start(self):
        if self.name == "gate-worker-watch":
            watchers.append(None)
            if len(watchers) == 2:  # a batch's second
                raise RuntimeError("can't start new thread")
        return started(self)

    cases = read_cases(EVAL)[:6]
    play_cases(cases, ["naive"], workers=3)  # the first batch: what any batch opens once is open
    fds = len(os.listdir("/proc/self/fd")) if LINUX else 0
    monkeypatch.setattr(threading.Thread, "start", start)
    for _ in range(3):
        watchers.clear()
        with pytest.raises(GateError, match="could not start 3 worker processes"):
            play_cases(cases, ["naive"], workers=3)
    if LINUX:
        assert len(os.listdir("/proc/self/fd")) == fds
        children = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
        assert not [c for c in children if not _alive(int(c))], "a worker left unreaped"


def test_a_case_whose_contract_another_suite_checked_is_checked_for_its_own(tmp_path):
    """A contract is not checked again when it is the one the case before carries: a classic case carrying the v2
    contract of the v2 case before it was not checked, so a line refused on its own was read (an outside review's)."""
    v2 = json.loads(V2.read_text().splitlines()[0])
    classic = json.loads(EVAL.read_text().splitlines()[0])
    classic["contract"] = v2["contract"]

    def names(value):
        if isinstance(value, dict):
            return set(value) | {n for v in value.values() for n in names(v)}
        return {n for v in value for n in names(v)} if isinstance(value, list) else set()

    for case in (v2, classic):  # every name of the contract named again, in either case: how the JSON reader
        case["zz_names"] = dict.fromkeys(sorted(names(v2["contract"])), 0)  # shares names decides marshal's bytes
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(classic) + "\n")
    with pytest.raises(CaseError, match="contract"):
        read_cases(alone)
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps(v2) + "\n" + json.dumps(classic) + "\n")
    with pytest.raises(CaseError, match="contract"):
        read_cases(both)


def test_a_later_worker_holds_nothing_the_parent_watches_earlier_ones_by(tmp_path, agents):
    """The parent watches each worker through a descriptor of the process (pidfd): a worker forked after it
    inherited the earlier workers' and held them while it played."""
    env, pids = agents
    p = _report(_cases(tmp_path, 8), "hostile_agents:ListsItsDescriptors", 4, env)
    assert p.returncode == 0, p.stderr[-2000:]
    held = Path(str(pids) + ".fds").read_text().splitlines()
    assert held and not [fd for fd in held if "pidfd" in fd], held


def test_a_worker_that_closes_its_pipe_and_plays_on_is_said_to(tmp_path, agents):
    env, _ = agents
    p = _report(_cases(tmp_path, 4), "hostile_agents:ClosesItsPipe", 2, env)
    assert p.returncode == 2 and p.stderr.startswith("gate: error: a worker process ended without answering (it "
                                                     "closed its end of the pipe and is still running) "), p.stderr


def test_an_agent_interrupting_in_a_worker_is_an_interrupt(tmp_path, agents):
    """An agent raising KeyboardInterrupt is `gate: interrupted` (exit 130) in one process; in a worker it was said
    to be a worker killed or out of memory (exit 2)."""
    env, _ = agents
    path = _cases(tmp_path, 4)
    for workers in (1, 2):
        p = _report(path, "hostile_agents:Interrupts", workers, env)
        assert (p.returncode, p.stdout, p.stderr) == (130, "", "gate: interrupted\n"), (workers, p.stderr[-2000:])


def test_a_worker_that_ends_without_answering_says_how_it_ended(tmp_path, agents):
    """A worker ended by its agent's `os._exit(3)` was reported as killed or out of memory: the exit status is said."""
    env, _ = agents
    p = _report(_cases(tmp_path, 4), "hostile_agents:Exits", 2, env)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("gate: error: a worker process ended without answering (its exit code 3) "), p.stderr


@pytest.mark.skipif(not LINUX, reason="the parent-death signal is Linux's")
def test_a_worker_whose_agent_catches_sigterm_ends_with_gate_all_the_same(tmp_path, agents):
    """A worker is sent a signal when gate's process ends (Linux's parent-death signal): it was SIGTERM, which an
    agent that handles SIGTERM caught, playing on for nobody after `kill -9` of gate. It is SIGKILL now."""
    env, pids = agents
    proc = subprocess.Popen([GATE, "report", "--cases", str(_cases(tmp_path, 4)), "--agents",
                             "hostile_agents:IgnoresTerm", "--workers", "2", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(pids.read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [int(p) for p in pids.read_text().split()]
        assert len(workers) == 2, "the workers did not start playing"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers)), "a worker plays on after gate was killed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not LINUX, reason="pidfd_open is Linux's")
def test_a_process_an_agent_leaves_behind_does_not_keep_gate_waiting(tmp_path, agents):
    """gate learnt that a worker ended only when the worker's pipe closed: a process the agent forked keeps the
    pipe open, so a worker that ended without answering held gate for as long as that process lived (for ever,
    for one that never ends). gate now watches the worker process itself."""
    env, pids = agents
    started = time.monotonic()
    p = _report(_cases(tmp_path, 4), "hostile_agents:LeavesAGrandchild", 2, env, timeout=60)
    took = time.monotonic() - started
    assert took < 15, took
    assert any(map(_alive, map(int, pids.read_text().split()))), "the agent's process ended already: no test"
    assert p.returncode == 2 and p.stderr.startswith(
        "gate: error: a worker process ended without answering (its exit code 9) "), p.stderr


@pytest.mark.skipif(not LINUX, reason="pidfd_open is Linux's")
def test_a_worker_that_dies_halfway_through_its_results_does_not_keep_gate_waiting(tmp_path, agents):
    """Once the parent had begun reading a message, it waited for the rest of it: a worker killed halfway through
    sending its results, while a process its agent forked held its pipe, held gate until that process ended. The
    pipe's reading side is now shut once the worker has ended: what it sent is read, then the end of the file."""
    env, pids = agents
    started = time.monotonic()
    p = _report(_cases(tmp_path, 4), "hostile_agents:DiesSendingWithAGrandchild", 2, env, timeout=60)
    assert time.monotonic() - started < 15
    assert any(map(_alive, map(int, pids.read_text().split()))), "the agent's process ended already: no test"
    assert p.returncode == 2 and p.stderr.startswith(
        "gate: error: a worker process ended without answering (killed by SIGKILL, perhaps out of memory) "), p.stderr


@pytest.mark.parametrize("lines", [True, False], ids=["a case file's lines", "cases"])
def test_a_refused_batch_leaves_no_descriptor_open(tmp_path, monkeypatch, lines):
    """A batch refused by its workers (a bad line; a defect raised in a worker) kept every worker's pipes open until
    the garbage collector found the exception's cycle: four refusals in one process held 24 more descriptors."""
    from gate_pipeline.kernel import engine
    text = EVAL.read_text().splitlines()[:12]
    text[10] = "{not json"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(text) + "\n")
    good = read_cases(EVAL)[:10]
    real_prepare = engine.prepare

    def breaking(case):
        if case.case_id == good[8].case_id:
            raise ZeroDivisionError("a defect")
        return real_prepare(case)

    monkeypatch.setattr(engine, "prepare", breaking)  # the workers fork with it

    def attempt():
        with pytest.raises(CaseError if lines else ZeroDivisionError):
            play_cases(CaseLines.read(bad) if lines else good, ["naive"], workers=3)

    attempt()
    before = len(os.listdir("/proc/self/fd")) if LINUX else 0
    for _ in range(4):
        attempt()
    if LINUX:
        assert len(os.listdir("/proc/self/fd")) == before
