"""The one base class of every error a user of gate can cause: a bad file, flag, name or value.

Each surface catches `GateError` in one place and turns it into its own form: one line and exit
status 2 on the command line, an error frame over the wire, a failed run in Dagster. Anything
else that escapes is a bug in gate.
"""
from __future__ import annotations


class GateError(Exception):
    """Something gate was given that it cannot use; the message says what and where, in one line.

    The errors about a value (a case, a contract, a name, an option) are also `ValueError`s; a bad flag
    (`cli.errors.UsageError`) is not, so that argparse passes it through to the one place that prints it."""


class UnknownAgent(GateError, ValueError):
    """No agent by that name."""


class AgentOptionError(GateError, ValueError):
    """The agent exists but does not take these options, or refuses their values."""


class RepeatedAgent(GateError, ValueError):
    """One agent (the same name and options) named twice for one batch: each agent plays each case once, and its
    results are kept by its identity."""


class NoRoom(GateError):
    """The machine had no room for what an episode needs, not the agent's doing: its database's pages (the
    disk, or the file-size limit, where SQLite keeps a large database's temporary file: `kernel.world.connect`),
    or the process that compiles a statement first (`kernel.compile_check`)."""
