"""The code location's settings, resolved once when the definitions load (GATE_SUITES registered then).

What is fixed when the location loads reads them here: the schedule's default status, the agents a
run may name, the default cases directory. What a run or a sensor tick reads (where the run store
and the cases are) the resources resolve when the run or tick starts (`resources.run_settings`),
as Dagster resolves a resource's `EnvVar`.
"""
from __future__ import annotations

import dataclasses
import sys

from ..kernel.settings import Settings

SETTINGS = Settings.from_env()
SETTINGS.register_suites()


def allow_agents(names: list[str]) -> list[str]:
    """Add agent names to those this code location lists, for this process only: what `gate nightly`
    was given on its own command line (it runs the job in process), before the definitions load.
    The names that are still not listed (the definitions were loaded before): a run config naming
    them is refused."""
    global SETTINGS
    catalog = sys.modules.get(f"{__package__}.catalog")
    if catalog is not None:
        return [n for n in names if n not in catalog.AgentName.__members__]
    extra = tuple(n for n in names if n not in SETTINGS.extra_agents)
    SETTINGS = dataclasses.replace(SETTINGS, extra_agents=(*SETTINGS.extra_agents, *extra))
    return []


def run_settings() -> Settings:
    """The settings a run or a sensor tick starts with (the process's environment, as `EnvVar` reads it)."""
    return Settings.from_env()
