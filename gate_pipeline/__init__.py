"""gate: does a tool-using agent stop a bad batch before it becomes a wrong number?

The core (cases, world, tools, ledger, grader, rewards, agents, the engine) imports nothing
from Dagster; `gate_pipeline.dagster_defs`, the command line and the integrations sit on top.
"""
import sys

__version__ = "0.2.0"

# `gymnasium.make("gate_pipeline:gate/Gate-v0")` imports this package: register the env then.
if "gymnasium" in sys.modules:
    from .integrations import gymnasium_env as _gymnasium_env  # noqa: F401  (registers gate/Gate-v0)

# verifiers finds an environment by its package name: `vf-eval gate-pipeline` (0.3) imports this package and calls
# `load_environment`; `vf-eval gate-pipeline` (0.4) takes the Taskset subclass `__all__` names. Both are loaded
# only when asked for, so importing gate never imports verifiers.
__all__ = ["GateTaskset", "load_environment"]
_LAZY = {"load_environment": ("integrations.verifiers_env", "load_environment"),
         "GateTaskset": ("integrations.verifiers_v1", "GateTaskset")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    module, attr = _LAZY[name]
    try:
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    except ImportError as exc:  # the extra is not installed: not found, as verifiers expects of a missing name
        raise AttributeError(f"gate_pipeline.{name} needs verifiers ({exc}); pip install 'gate-pipeline[verifiers]' "
                             f"(0.3) or 'gate-pipeline[verifiers-v1]' (0.4)") from None
