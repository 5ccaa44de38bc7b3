"""The CLI's own user-facing error (a bad flag or path): like every `GateError`, one line and exit status 2."""
from __future__ import annotations

from ..kernel.errors import GateError


class UsageError(GateError):
    """A problem with what the user asked for (flag, file, name); printed as one line."""
