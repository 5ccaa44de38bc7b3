"""`gate cases generate`: a suite's case files, byte-identical on every run (`gate cases export`: cli/export.py)."""
from __future__ import annotations

from pathlib import Path

from ..kernel.errors import GateError
from ..kernel.settings import SPLIT_FILES, Settings
from ..kernel.suite import suites
from .common import Parser, int_arg, output_file
from .errors import UsageError

SPLITS = ("eval", "train")


def cmd_cases_generate(a, settings: Settings) -> int:
    suite = suites.get(a.suite) if a.suite is not None else suites.default()
    splits = SPLITS if a.split == "both" else (a.split,)
    if a.rows is not None:
        if suite.rows is None:
            raise UsageError(f"--rows: the {suite.name} suite's batch sizes are fixed")
        least, most, _ = suite.rows
        int_arg("--rows", least, most)(str(a.rows))
    out = a.out or f"cases/{suite.name}"
    if Path(out).exists() and not Path(out).is_dir():
        raise UsageError(f"--out {out}: is a file; --out names the folder the case files are written into")
    if Path(out).is_dir():  # a file there that is not a case file (gate's begin '{"') is not overwritten
        for split in splits:
            output_file("--out", Path(out) / SPLIT_FILES[split], b'{"')
    try:
        paths = suite.generate(out, settings.contracts_dir, a.rows, splits)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc}: {exc.filename})") from None
    except GateError:
        raise
    except ValueError as exc:  # what the suite's generator cannot do (a split it writes only whole...)
        raise UsageError(str(exc)) from None
    for p in paths:
        print(p)
    return 0


def register(subparsers) -> None:
    cases = subparsers.add_parser("cases", help="write a suite's case files, export them as a dataset",
                                  description="Case files.")
    csub = cases.add_subparsers(dest="cases_command", parser_class=Parser, title="commands", metavar="COMMAND")
    gen = csub.add_parser("generate", help="write a suite's case files (byte-identical on every run)",
                          epilog="examples:\n  gate cases generate --suite classic --out /tmp/cases\n"
                                 "  gate cases generate --suite v2 --rows 2000 --split eval --out /tmp/v2")
    gen.add_argument("--suite", default=None, help="the suite to generate (default: the default suite, classic)")
    gen.add_argument("--out", default=None, help="folder to write eval_curated.jsonl and train_procedural.jsonl "
                                                 "into (default: cases/SUITE)")
    gen.add_argument("--rows", type=int_arg("--rows"), default=None,
                     help="rows per batch, for a suite whose sizes scale (v2: 20 to 10,000,000; default 20)")
    gen.add_argument("--split", choices=("both", *SPLITS), default="both", help="which file(s) to write")
    gen.set_defaults(fn=cmd_cases_generate)
    from . import export
    export.register(csub)
