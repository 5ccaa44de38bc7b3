"""What every `gate` subcommand shares: the parser, number flags, agent and case-file arguments, playing cases.

Every command is `fn(args, settings)`: `main` resolves the settings once (`Settings.from_env`, the
directories they name checked) and hands them down.
"""
from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

from ..kernel.files import path_state
from ..kernel.numbers import whole_number
from ..kernel.settings import Settings
from .errors import UsageError
from .progress import progress_bar


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs (examples) kept as written; every option's default shown unless its help states it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is not None and not isinstance(default, bool) and default is not argparse.SUPPRESS
                and action.option_strings and "default" not in text):
            text += f" (default: {default})"
        return text


class Parser(argparse.ArgumentParser):
    """One-line errors; remembers its options and commands, so an unknown option can list the accepted ones."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # an option is spelt out: --agent is not --agents
        self.arguments: list[argparse.Action] = []  # as added, --help and --version included
        self.commands = None  # the add_subparsers action, if any
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    @property
    def options(self) -> list[str]:
        """The long options a user can give (not --help)."""
        return [o for a in self.arguments for o in a.option_strings if o.startswith("--") and o != "--help"]

    def add_subparsers(self, **kwargs):
        self.commands = super().add_subparsers(**kwargs)
        return self.commands

    def reached(self, names: list[str]) -> "Parser":
        """The (sub)parser that `prog NAME...` reaches."""
        parser = self
        for name in names:
            if parser.commands is None or name not in parser.commands.choices:
                break
            parser = parser.commands.choices[name]
        return parser

    def error(self, message):  # one line, exit 2
        raise UsageError(message)


def agents_epilog(examples: list[str]) -> str:
    """The agent names a command takes, and examples: the end of its --help."""
    from ..kernel.agents import agent_names
    lines = ["agents: " + ", ".join(agent_names()),
             "  or careful@<variant> (a contract-schema variant), module:Class (your own agent, importable),",
             "  or a name an installed package registers in the gate.agents entry-point group", "", "examples:"]
    return "\n".join(lines + [f"  {e}" for e in examples])


CASES_HELP = "case file, JSON lines (default: the eval split of the default suite shipped with gate)"
WORKERS_HELP = "processes to play in (default: one per CPU from 64 episodes on, else 1)"


def agent_list(text: str | None, default: list[str]) -> list[str]:
    """The names in a comma-separated --agents value (the default when the flag is absent)."""
    if text is None:
        return list(default)
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise UsageError("--agents needs at least one agent name")
    return names


def resolve_agents(names: list[str], settings: Settings, options: dict | None = None) -> list:
    """Each name checked and built once (AgentSpec), with its options; errors are one line."""
    from ..kernel.agents import resolve_agents as resolved
    return resolved(names, options, contracts=settings.contracts_dir)


def checked_settings() -> Settings:
    """The settings from the environment, every directory it names checked, GATE_SUITES registered (one-line
    errors): once per command, in `main`."""
    settings = Settings.from_env()
    problems = settings.problems()
    if problems:
        raise UsageError(problems[0])
    settings.register_suites()
    return settings


def cases_arg(a, settings: Settings) -> Path:
    """The --cases file, or the eval split of the case library (GATE_CASES_DIR, else the shipped one)."""
    if a.cases is not None and not a.cases.strip():  # `--cases "$UNSET"`: not the eval split in its place
        raise UsageError("--cases is empty: give a case file, or leave --cases out for the eval split")
    if not a.cases:
        path = settings.cases_file("eval")
        if path_state(path) != "file":
            raise UsageError(f"no eval case file: looked for {path} (GATE_CASES_DIR={settings.cases_dir}); "
                             f"pass --cases FILE")
        return path
    path = Path(a.cases)
    if path_state(path) == "missing":  # (a name too long for the system, too: nothing can be there)
        where = "" if path.is_absolute() else f" (looked for {path.absolute()}, from {Path.cwd()})"
        raise UsageError(f"--cases {a.cases}: no such case file{where}")
    return path


def output_file(flag: str, path: str | Path, starts: bytes) -> Path:
    """An output file checked before any work is done: not a folder, in a folder that exists, and, when something
    is there already, a regular file that is empty or begins as what gate writes there (`starts`): a FIFO nobody
    reads would hold the write for ever, and a run store, its key or a case file named by mistake is not
    overwritten. `flag` names the argument in the one-line error (none: a positional one)."""
    target = Path(path)
    name = f"{flag} {path}" if flag else str(path)
    if path_state(target) == "directory":
        raise UsageError(f"{name}: is a directory; give a file name")
    if path_state(target.parent) != "directory":
        raise UsageError(f"{name}: folder {target.parent} does not exist")
    if path_state(target) == "missing":  # (a link to nowhere: writing creates what it names)
        return target
    if os.path.samefile(target, os.devnull):  # written to be thrown away
        return target
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise UsageError(f"{name}: cannot write there ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{name}: is not a regular file (a FIFO, a device or a socket); give a file name")
        head = os.read(fd, len(starts))
    finally:
        os.close(fd)
    if head and head.lower() != starts.lower():
        raise UsageError(f"{name}: a file is there that gate did not write (it does not begin "
                         f"{starts.decode()!r}); remove it or give another name")
    return target


def workers_for(requested: int | None, episodes: int) -> int:
    """Worker processes for a batch: as asked, else one per available CPU once there are 64 episodes."""
    if requested is not None:
        return requested
    if episodes < 64:
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without CPU affinity
        return os.cpu_count() or 1


def play_with_progress(cases: list, specs: list, reward: str = "terminal", workers: int | None = None,
                       show: bool = True) -> dict:
    from ..kernel.engine import play_cases
    with progress_bar(len(cases), "cases", enabled=show) as advance:
        return play_cases(cases, specs, reward=reward, progress=advance,
                          workers=workers_for(workers, len(cases) * len(specs)))


MAX_WORKERS = 256  # worker processes: each is a fork, and more of them than this is no batch any machine here plays


def int_arg(flag: str, low: int = 1, high: int | None = None):
    """An argparse type for `flag`: a whole number from `low` (to `high`), else a one-line UsageError. The one
    parser of every whole-number flag (--workers, --port, --rows, ...)."""
    def parse(text: str) -> int:
        value = whole_number(text)
        if value is None:
            raise UsageError(f"{flag} must be a whole number, not {_quoted(text)}")
        if value < low or (high is not None and value > high):
            bound = f"from {low:,} to {high:,}" if high is not None else f"at least {low:,}"
            raise UsageError(f"{flag} must be {bound}, not {value:,}" if len(text) <= 40 else
                             f"{flag} must be {bound}, not {_quoted(text)}")
        return value
    return parse


def positive_arg(flag: str, low: float | None = None, high: float | None = None):
    """An argparse type for `flag`: a finite number above 0 (a time, a temperature's bound), from `low` to
    `high` when given, else one line."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} must be a number, not {_quoted(text)}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise UsageError(f"{flag} must be a finite number, not {_quoted(text)}")
        if not (value > 0 and (low is None or value >= low) and (high is None or value <= high)):
            if low is None:
                bound = "more than 0" if high is None else f"more than 0 and at most {high:,g}"
            else:
                bound = f"at least {low:,g}" if high is None else f"from {low:,g} to {high:,g}"
            raise UsageError(f"{flag} must be {bound}, not {_quoted(text)}")
        return value
    return parse


def _quoted(text: str, most: int = 40) -> str:
    """A flag's value as an error line shows it: quoted, and cut after `most` characters."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}... ({len(text):,} characters)"


workers_arg = int_arg("--workers", 1, MAX_WORKERS)


def grades_of(results: dict) -> dict:
    return {name: [r.grade for r in rs] for name, rs in results.items()}


def grades_json(grades: dict) -> str:
    return json.dumps({"agents": {name: [g.as_dict() for g in gs] for name, gs in grades.items()}})
