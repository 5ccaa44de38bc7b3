"""What every `gate` subcommand shares: one-line errors, agent and case-file arguments, playing cases."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..settings import Settings
from .errors import UsageError
from .progress import progress_bar


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(message)


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
    from ..agents import resolve_agent
    options = options or {}
    return [resolve_agent(name, options.get(name), contracts=settings.contracts_dir) for name in names]


def cases_arg(a, settings: Settings) -> Path:
    """The --cases file, or the shipped eval split."""
    return Path(a.cases) if a.cases else settings.cases_file("eval")


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


def play_with_progress(cases: list[dict], specs: list, reward: str = "terminal", workers: int | None = None) -> dict:
    from ..engine import play_cases
    with progress_bar(len(cases), "cases") as advance:
        return play_cases(cases, specs, reward=reward, progress=advance,
                          workers=workers_for(workers, len(cases) * len(specs)))


def count_arg(flag: str):
    """An argparse type for `flag`: a whole number of at least 1, else a one-line UsageError."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"{flag} must be a whole number, not {text!r}") from None
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")
        return value
    return parse


workers_arg = count_arg("--workers")


def grades_of(results: dict) -> dict:
    return {name: [r.grade for r in rs] for name, rs in results.items()}


def grades_json(grades: dict) -> str:
    return json.dumps({"agents": {name: [g.as_dict() for g in gs] for name, gs in grades.items()}})
