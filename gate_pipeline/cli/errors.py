"""The CLI's user-facing error: printed as one line, exit status 2."""


class UsageError(Exception):
    """A problem with what the user asked for (flag, file, name); printed as one line."""
