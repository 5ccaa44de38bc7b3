"""gate's kernel: what plays and grades an episode of any suite, and knows no suite.

    from gate_pipeline.kernel import CasePool, Session, play, read_cases, resolve_agent

- `suite.py`: what a suite is (`Suite`, its `Tool`s) and the registry (`suites`);
- `cases.py`: case files and the typed `Case`; `contract.py`: contract documents;
- `world.py`, `episode.py`, `sandbox.py`: the prepared case, one episode's world, its tools, the SQL sandbox;
- `ledger.py`, `grading.py`, `rewards.py`: the hash-chained ledger, the grader, the reward modes;
- `records.py`: `Grade`, `EpisodeResult`, `StoredEpisode`; `actions.py`: the one action parser;
- `agents.py`: what an agent is, agents by name; `variants.py`: contract-schema variants;
- `engine.py`: the one engine (`Session`, `play`, `replay`, `play_cases`); `pool.py`: the one case pool;
- `settings.py`: the one settings object; `errors.py`: `GateError`, the base of every user error.
"""
from .agents import AgentSpec, make_agent, resolve_agent
from .cases import Case, read_cases
from .engine import Session, play, play_cases, prepare, replay
from .pool import CasePool
from .settings import Settings
from .suite import suites

__all__ = ["AgentSpec", "Case", "CasePool", "Session", "Settings", "make_agent", "play", "play_cases", "prepare",
           "read_cases", "replay", "resolve_agent", "suites"]
