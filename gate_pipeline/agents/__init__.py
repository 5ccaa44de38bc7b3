"""gate's agents that belong to no suite: naive, refuse-all and the random policy (registered as `gate.agents`
entry points, as a plugin's agents are). What an agent is, and agents by name: `gate_pipeline.kernel.agents`."""
