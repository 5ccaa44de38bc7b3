"""Running a real model on gate: an OpenAI-compatible tool-calling agent, concurrent rollouts, pass^k.

No Dagster here: the pipeline selects the agent by name through gate_pipeline.agents.make_agent.
"""
