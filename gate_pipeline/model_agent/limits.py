"""Bounds of a model run's settings that the command line checks before anything is imported for the run."""

MAX_RETRIES = 100  # the client's retries per request: beyond this a dead server is retried, with backoff, for hours
MAX_CALLS_PER_REPLY = 64  # tool calls played from one reply (structured or written as text); the rest are dropped
