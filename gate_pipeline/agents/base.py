"""What an agent is to gate: something that plays one episode through the seven tools.

An agent has `play(tools, case=None)`. `tools(name, **args)` returns exactly what the tool
returns to any agent (`tools.act(action)` takes an action in any spelling `actions.py`
accepts); `tools.episode_seed` is a number fixed by the case, for agents that draw at random.
Only oracle attackers (`oracle = True`) also get the case, truth labels included; they say so.
The engine builds a fresh agent for every episode.
"""
from __future__ import annotations

from typing import Protocol


class Tools(Protocol):
    episode_seed: int

    def __call__(self, name: str, **args) -> object: ...

    def act(self, action) -> object: ...


class Agent(Protocol):
    name: str
    oracle: bool

    def play(self, tools: Tools, case: dict | None = None) -> None: ...


def customers_first(listing: list[dict]) -> list[dict]:
    """The load order every careful agent uses: customers batches first, then by batch id."""
    return sorted(listing, key=lambda b: (b["table"] != "customers", b["batch_id"]))


class AgentUnfinished(Exception):
    """Raised by an agent that stops without finishing its episode for a reason of its own (a
    model agent out of turns, or whose server never answered); `end_reason` names the reason
    (records.MAX_TURNS, TIMEOUT, API_ERROR...). The episode grades 0 with the message."""

    def __init__(self, end_reason: str, message: str):
        super().__init__(message)
        self.end_reason = end_reason
