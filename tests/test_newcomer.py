"""A newcomer's first hour: the command line explains itself, your own agent plays everywhere,
mistakes name where gate looked, output survives a closed pipe, Ctrl-C is `gate: interrupted`,
and progress goes to a terminal's stderr only. Every test runs `gate` as a user does: a fresh
process, from a directory of the test's own."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EVAL, ROOT

from gate_pipeline import __version__
from gate_pipeline.kernel.agents import agent_names

GATE = str(Path(sys.executable).parent / "gate")
EXAMPLES = ROOT / "examples"


def env_with(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_CASES_DIR", "GATE_CONTRACTS", "PYTHONPATH")}
    return {**env, **extra}


def gate(*args, cwd, env=None, timeout=300, **kw):
    return subprocess.run([GATE, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=env or env_with(), check=False, **kw)


def one_line_error(p, text):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gate: error:") and text in p.stderr, p.stderr


# --- the command line explains itself -------------------------------------------------------------

@pytest.mark.parametrize("args", [[], ["cases"]])
def test_a_command_alone_prints_its_commands(args, tmp_path):
    p = gate(*args, cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.startswith(f"usage: gate {' '.join(args)}".rstrip() + " ")
    expected = ["generate"] if args else ["cases", "report", "attacks", "replay", "experiment", "nightly", "run",
                                          "ui", "verify"]
    listed = p.stdout.split("commands:", 1)[1]
    assert all(f"\n    {name} " in listed or f"\n    {name}\n" in listed for name in expected), p.stdout


def test_version(tmp_path):
    p = gate("--version", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == f"gate {__version__}"


def every_parser():
    from gate_pipeline.cli.main import build_parser
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        yield parser
        if parser.commands is not None:
            todo.extend(parser.commands.choices.values())


def test_every_option_has_help_and_its_default_shows():
    missing = []
    for parser in every_parser():
        rendered = parser.format_help()
        for action in parser.arguments:
            if not action.option_strings or {"--help", "--version"} & set(action.option_strings):
                continue
            if not action.help:
                missing.append(f"{parser.prog} {action.option_strings[0]}: no help")
            default = action.default
            if default is not None and not isinstance(default, bool) and str(default) not in rendered:
                missing.append(f"{parser.prog} {action.option_strings[0]}: default {default!r} not shown")
    assert missing == []


@pytest.mark.parametrize("command", ["report", "attacks", "nightly"])
def test_help_of_a_command_taking_agents_lists_them_with_examples(command, tmp_path):
    p = gate(command, "--help", cwd=tmp_path)
    assert p.returncode == 0
    assert "agents: " + ", ".join(agent_names()) in p.stdout
    assert "module:Class" in p.stdout and "gate.agents" in p.stdout
    assert f"examples:\n  gate {command}" in p.stdout


@pytest.mark.parametrize("command", ["experiment", "run", "ui", "verify", "replay", "cases generate"])
def test_help_of_every_other_command_has_an_example(command, tmp_path):
    p = gate(*command.split(), "--help", cwd=tmp_path)
    assert p.returncode == 0 and "example" in p.stdout and f"\n  gate {command}" in p.stdout


@pytest.mark.parametrize("args,text", [
    (["report", "--bogus", "1"], "unrecognized arguments: --bogus 1; gate report takes --cases, --agents, --json, "
                                 "--reward, --seed, --html, --workers"),
    (["nightly", "--agent", "careful"], "gate nightly takes --cases, --agents, --agent-options, --chunk-size"),
    (["report", "--agents", ""], "--agents needs at least one agent name"),
    (["report", "--agents", " , "], "--agents needs at least one agent name"),
    (["experiment", "--variants", ","], "--variants needs at least one variant name"),
    (["nightly", "--agents", "careful", "--agent-options", '{"careful": {"bogus": 1}}'],
     "agent 'careful' does not take option 'bogus'; it takes without, contract_view, order, loads_per_clean"),
])
def test_mistakes_name_what_is_accepted(args, text, tmp_path):
    one_line_error(gate(*args, cwd=tmp_path), text)


def test_missing_paths_say_where_gate_looked_and_from_where(tmp_path):
    one_line_error(gate("report", "--cases", "sub/x.jsonl", cwd=tmp_path),
                   f"--cases sub/x.jsonl: no such case file (looked for {tmp_path / 'sub' / 'x.jsonl'}, "
                   f"from {tmp_path})")
    one_line_error(gate("experiment", cwd=tmp_path, env=env_with(GATE_CONTRACTS="contracts")),
                   f"GATE_CONTRACTS=contracts: no such directory (looked for {tmp_path / 'contracts'}, "
                   f"from {tmp_path})")
    one_line_error(gate("report", cwd=tmp_path, env=env_with(GATE_CASES_DIR="/nowhere/cases")),
                   "GATE_CASES_DIR=/nowhere/cases: no such directory (looked for /nowhere/cases)")


# --- your own agent, everywhere -------------------------------------------------------------------

def test_the_readme_agent_plays_through_report_and_nightly_as_module_class(tmp_path):
    env = env_with(PYTHONPATH=str(EXAMPLES), GATE_HOME=str(tmp_path / "gate"))
    report = gate("report", "--json", "--agents", "my_agent:AmountCheck,careful", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    grades = json.loads(report.stdout)["agents"]
    nightly = gate("nightly", "--json", "--agents", "my_agent:AmountCheck,careful", cwd=tmp_path, env=env)
    assert nightly.returncode == 0, nightly.stderr
    board = json.loads(nightly.stdout)["agents"]
    mine = [g["reward"] for g in grades["my_agent:AmountCheck"]]
    assert board["my_agent:AmountCheck"]["reward"] == pytest.approx(sum(mine) / len(mine))
    assert 0.5 < board["my_agent:AmountCheck"]["reward"] < board["careful"]["reward"] == 1.0


def installed_plugin(root: Path) -> Path:
    """A package installed the way pip leaves one: its module, and a .dist-info with a gate.agents entry point."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "agents.py").write_text((EXAMPLES / "my_agent.py").read_text())
    info = root / "mypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gate.agents]\namount-check = mypkg.agents:AmountCheck\n")
    return root


def test_an_installed_entry_point_agent_plays_through_report_and_nightly(tmp_path):
    env = env_with(PYTHONPATH=str(installed_plugin(tmp_path / "site")), GATE_HOME=str(tmp_path / "gate"))
    listed = gate("report", "--help", cwd=tmp_path, env=env)
    assert "refuse-all, " in listed.stdout and "amount-check" in listed.stdout
    report = gate("report", "--json", "--agents", "amount-check", cwd=tmp_path, env=env)
    nightly = gate("nightly", "--json", "--agents", "amount-check", cwd=tmp_path, env=env)
    assert report.returncode == nightly.returncode == 0, report.stderr + nightly.stderr
    rewards = [g["reward"] for g in json.loads(report.stdout)["agents"]["amount-check"]]
    assert json.loads(nightly.stdout)["agents"]["amount-check"]["reward"] == pytest.approx(sum(rewards) / len(rewards))


# --- output survives --json and a closed pipe -----------------------------------------------------

def test_html_is_written_with_json(tmp_path):
    page = tmp_path / "report.html"
    p = gate("report", "--json", "--html", str(page), cwd=tmp_path)
    assert p.returncode == 0 and json.loads(p.stdout)["agents"]
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_html_is_written_when_the_reader_closes_the_pipe(tmp_path):
    page = tmp_path / "report.html"
    head = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p = subprocess.run([GATE, "report", "--html", str(page)], stdout=head.stdin, stderr=subprocess.PIPE, text=True,
                       cwd=tmp_path, env=env_with(), timeout=300, check=False)
    head.stdin.close()
    assert head.stdout.read() == "eval split: 32 cases, 64 batches, 24 defective\n"
    head.wait()
    assert p.returncode == 0 and p.stderr == ""
    assert page.read_text().startswith("<!DOCTYPE html>")


# --- interruptions --------------------------------------------------------------------------------

def test_ctrl_c_in_nightly_is_interrupted_and_130(tmp_path):
    from gate_pipeline.kernel.settings import Settings
    from gate_pipeline.store import RunStore
    home = tmp_path / "gate"
    # small chunks store episodes early, and eight agents make the night long enough for the signal to land in it
    agents = "naive,careful,refuse-all,careful-sql,random,profile-only,report-liar,double-load"
    proc = subprocess.Popen([GATE, "nightly", "--cases", str(ROOT / "cases" / "classic" / "train_procedural.jsonl"),
                             "--agents", agents, "--chunk-size", "8"],
                            cwd=tmp_path, env=env_with(GATE_HOME=str(home)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:  # interrupt once the job is playing
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        if (home / "runs.db").exists():
            store = RunStore(Settings(home=home))
            try:
                if store.count_episodes() > 0:
                    break
            finally:
                store.dispose()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err == "gate: interrupted\n" and out == ""


@pytest.mark.parametrize("how", ["raise KeyboardInterrupt", "os.kill(os.getpid(), signal.SIGINT)"])
@pytest.mark.parametrize("script", ["gate", "server", "server/app.py"])
def test_ctrl_c_while_the_commands_are_imported_is_interrupted_and_130(script, how):
    """Importing the commands takes about a tenth of a second: a Ctrl-C then (sent here by an import hook as the
    kernel is imported, where a real one mostly lands: raised as Python raises it, or a real signal) is `gate:
    interrupted` and 130, as in a command, never a traceback or the command run to its end (Python's import
    machinery can swallow a KeyboardInterrupt raised in one of its callbacks: the signal is only noted while
    the commands are imported); the console scripts and server/app.py import nothing of it themselves."""
    path = ROOT / script if "/" in script else Path(sys.executable).parent / script
    code = ("import os, runpy, signal, sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'gate_pipeline.kernel':\n"
            f"            {how}\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            f"runpy.run_path({str(path)!r}, run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code, "report"], capture_output=True, text=True, env=env_with(),
                       timeout=60, check=False)
    assert (p.returncode, p.stderr, p.stdout) == (130, "gate: interrupted\n", ""), p.stderr[-2000:]


def test_an_ignored_sigint_stays_ignored_while_the_commands_are_imported():
    """A shell's background job starts with SIGINT ignored, and Python keeps it so: noting Ctrl-C while the commands
    are imported must not make a job that ignores it stop."""
    code = ("import os, runpy, signal, sys\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'gate_pipeline.kernel':\n"
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            f"runpy.run_path({GATE!r}, run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, env=env_with(),
                       timeout=60, check=False)
    assert (p.returncode, p.stdout, p.stderr) == (0, f"gate {__version__}\n", ""), p.stderr[-2000:]


# --- progress: a terminal's stderr only -----------------------------------------------------------

def run_with_terminal_stderr(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """`gate ARGS` with stdout a pipe and stderr a pseudo-terminal; (status, stdout, what the terminal saw)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([GATE, *args], cwd=cwd, env=env_with(COLUMNS="100"), stdout=subprocess.PIPE,
                            stderr=follower, text=True)
    os.close(follower)
    seen = b""
    stdout_chunks = []
    while True:
        ready, _, _ = select.select([leader, proc.stdout], [], [], 120)
        assert ready, "gate went silent"
        if leader in ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                chunk = b""
            seen += chunk
        if proc.stdout in ready:
            line = proc.stdout.readline()
            if line:
                stdout_chunks.append(line)
            elif proc.poll() is not None:
                break
    stdout_chunks.append(proc.stdout.read())
    os.close(leader)
    return proc.wait(), "".join(stdout_chunks), seen.decode(errors="replace")


def few_cases(tmp_path: Path, n: int = 8) -> str:
    from gate_pipeline.kernel.cases import read_cases, write_cases
    path = tmp_path / "cases" / "eval_few.jsonl"
    write_cases(path, read_cases(EVAL)[:n])
    return str(path)


@pytest.mark.parametrize("args,label", [
    (["report"], "cases"),
    (["experiment", "--variants", "full,no-orders.amount.out_of_range"], "cases"),
])
def test_progress_goes_to_a_terminal_stderr_and_never_to_stdout(args, label, tmp_path):
    args = [*args, "--cases", few_cases(tmp_path)]
    status, out, terminal = run_with_terminal_stderr(args, tmp_path)
    assert status == 0
    assert label in terminal and "━" in terminal  # rich's bar, drawn on the terminal
    assert "━" not in out and out.strip()
    quiet = gate(*args, cwd=tmp_path)  # stderr a pipe: no bar
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == out


def test_nightly_progress_on_a_terminal_and_none_with_json(tmp_path):
    cases = ["--cases", few_cases(tmp_path, 16)]
    status, out, terminal = run_with_terminal_stderr(["nightly", "--agents", "careful", *cases], tmp_path)
    assert status == 0 and "episodes" in terminal and "━" in terminal and "━" not in out
    status, out, terminal = run_with_terminal_stderr(["nightly", "--agents", "careful", "--json", *cases], tmp_path)
    assert status == 0 and terminal == "" and json.loads(out)["agents"]["careful"]["reward"] == 1.0
