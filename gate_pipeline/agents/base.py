"""What an agent is to gate: something that plays one episode through the seven tools.

An agent gets `tools(name, **args)`, which returns exactly what the tool returns to any
agent. Only oracle attackers also get the case (its truth labels); they say so.
"""
from __future__ import annotations

from typing import Callable, Protocol

Tools = Callable[..., object]


class Agent(Protocol):
    name: str
    oracle: bool

    def play(self, tools: Tools, case: dict | None = None) -> None: ...


def customers_first(listing: list[dict]) -> list[dict]:
    """The load order every careful agent uses: customers batches first, then by batch id."""
    return sorted(listing, key=lambda b: (b["table"] != "customers", b["batch_id"]))


def report_what_happened(tools: Tools, loaded: list[str], quarantined: list[str]) -> None:
    tools("submit_report", loaded=loaded, quarantined=quarantined)
