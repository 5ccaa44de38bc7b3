"""`gate`: the command line. One module per command (`cli/<command>.py`, each with `register(subparsers)`
and `cmd_<command>(args, settings)`), every one a thin caller of the one engine.

`main` resolves the settings once and catches every error a user can cause in one place: a
`GateError` (a bad flag, a missing or malformed file, an unknown agent or suite) ends in one line on
stderr and exit status 2, never a traceback; Ctrl-C is `gate: interrupted` and 130.
"""
from __future__ import annotations

import gc
import importlib
import os
import sys

from ..kernel.errors import GateError
from .common import Parser, checked_settings
from .errors import UsageError

# every command's module, in the order `gate --help` lists them
COMMANDS: tuple[str, ...] = ("cases", "report", "attacks", "replay", "experiment", "nightly", "run", "serve", "ui",
                             "verify")


def build_parser() -> Parser:
    from .. import __version__
    p = Parser(prog="gate", description="gate: does a tool-using agent stop a bad batch before it becomes a "
                                        "wrong number?", epilog="run `gate COMMAND --help` for a command's options")
    p.add_argument("--version", action="version", version=f"gate {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=Parser, title="commands", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` names (default: this process's command line, and then the process ends)."""
    code = _main(argv)
    if argv is None:
        # the process ends next: as it does, the interpreter collects the heap again and again while it
        # tears it down (half a second once Dagster, pandas and matplotlib are loaded); frozen, it does not
        gc.freeze()
    return code


def _main(argv: list[str] | None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        reached = parser.reached([n for n in (getattr(args, "command", None), getattr(args, "cases_command", None))
                                  if n])
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}; {reached.prog} takes "
                             f"{', '.join(reached.options) or 'no options'}")
        if not hasattr(args, "fn"):  # `gate` or `gate cases` alone: what there is to run
            reached.print_help()
            return 0
        from ..kernel.engine import fewer_collections
        with fewer_collections():  # a command reads and plays many objects: the collector need not walk them as often
            return args.fn(args, checked_settings())
    except GateError as exc:
        print(f"gate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped reading (`gate report | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not complain
        return 0


if __name__ == "__main__":
    sys.exit(main())
