"""The two ways an agent name can be wrong (kept apart so anything that resolves agents can raise them)."""


class UnknownAgent(ValueError):
    """No agent by that name."""


class AgentOptionError(ValueError):
    """The agent exists but does not take these options, or refuses their values."""
