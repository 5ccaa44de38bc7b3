"""The code location's settings, resolved once when the definitions load (GATE_SUITES registered then).

What is fixed when the location loads reads them here: the schedule's default status, the agents a
run may name, the default cases directory. What a run or a sensor tick reads (where the run store
and the cases are) the resources resolve when the run or tick starts (`resources.run_settings`),
as Dagster resolves a resource's `EnvVar`.
"""
from __future__ import annotations

from ..kernel.settings import Settings

SETTINGS = Settings.from_env()
SETTINGS.register_suites()


def run_settings() -> Settings:
    """The settings a run or a sensor tick starts with (the process's environment, as `EnvVar` reads it)."""
    return Settings.from_env()
