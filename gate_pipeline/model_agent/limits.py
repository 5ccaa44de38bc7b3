"""Bounds of a model run's settings that the command line checks before anything is imported for the run."""

MAX_RETRIES = 100  # the client's retries per request: beyond this a dead server is retried, with backoff, for hours
