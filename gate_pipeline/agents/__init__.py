"""Every agent gate ships, by name (see `registry.py`). Agents play through the seven tools only."""
from __future__ import annotations

from .registry import (ATTACKERS, BASELINES, REWARD_HACKS, V2_ATTACKERS, V2_BASELINES, AgentOptionError, AgentSpec,
                       UnknownAgent, agent_names, make_agent, resolve_agent)

__all__ = ["ATTACKERS", "BASELINES", "REWARD_HACKS", "V2_ATTACKERS", "V2_BASELINES", "AgentOptionError", "AgentSpec",
           "UnknownAgent", "agent_names", "make_agent", "resolve_agent"]
