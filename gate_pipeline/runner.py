"""Playing agents on cases: one episode per (case, agent), graded, in order.

This is the hot path for benchmarks and reports, so each case is prepared once (its SQLite
image, profiles and correct mart) and every agent's episode opens a private copy of it.
"""
from __future__ import annotations

from typing import Callable, Iterable

from .agents import make_agent
from .grader import grade
from .tools import Episode
from .world import PreparedCase


def tools_of(episode: Episode) -> Callable[..., object]:
    def tools(name, **args):
        return episode.call(name, args)
    return tools


def play(prepared: PreparedCase, agent, keep_episode: bool = False):
    """One episode of `agent` on a prepared case; returns its grade (and the episode if asked).

    An agent that raises ends the episode where it stands: graded as it is (no report, no
    credit unless it had already reported) and the error recorded on the grade.
    """
    episode = Episode(prepared)
    error = None
    try:
        agent.play(tools_of(episode), prepared.case if getattr(agent, "oracle", False) else None)
    except Exception as exc:  # an agent's bug must not take the run down
        error = f"{type(exc).__name__}: {exc}"
    g = grade(episode)
    if error:
        g["error"] = error
    if keep_episode:
        return g, episode
    episode.close()
    return g


def play_agents(cases: Iterable[dict], agent_names: list[str], progress: Callable | None = None) -> dict:
    """{agent: [grade per case, in case order]} for every named agent."""
    agents = {name: make_agent(name) for name in agent_names}
    out: dict[str, list] = {name: [] for name in agent_names}
    for case in cases:
        prepared = PreparedCase(case)
        for name, agent in agents.items():
            out[name].append(play(prepared, agent))
        if progress:
            progress()
    return out


def replay(prepared: PreparedCase, calls: list) -> dict:
    """Apply recorded calls in order to a fresh episode (refused ones too; nothing stops early)."""
    episode = Episode(prepared)
    results = []
    for call in calls:
        if isinstance(call, dict):
            results.append(episode.call(call.get("tool"), call.get("args", {})))
        else:
            results.append(episode.call(None, call))
    g = grade(episode)
    out = {"case_id": prepared.case_id, "results": results, "ledger": episode.ledger.entries,
           "grade": g, "revenue": g["revenue"]}
    episode.close()
    return out
