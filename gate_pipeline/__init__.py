"""gate: does a tool-using agent stop a bad batch before it becomes a wrong number?

The core (cases, world, tools, ledger, grader, rewards, agents, the engine) imports nothing
from Dagster; `gate_pipeline.dagster_defs`, the command line and the integrations sit on top.
"""
import sys

__version__ = "0.2.0"

# `gymnasium.make("gate_pipeline:gate/Gate-v0")` imports this package: register the env then.
if "gymnasium" in sys.modules:
    from .integrations import gymnasium_env as _gymnasium_env  # noqa: F401  (registers gate/Gate-v0)
