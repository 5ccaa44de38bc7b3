"""`gate cases generate`: a suite's case files, byte-identical on every run (`gate cases export`: cli/export.py)."""
from __future__ import annotations

from pathlib import Path

from ..kernel.errors import GateError
from ..kernel.files import path_state
from ..kernel.settings import SPLIT_FILES, Settings
from ..kernel.suite import suites
from .common import Parser, int_arg, output_file
from .errors import UsageError

SPLITS = ("eval", "train")


DESCRIBED = ("orders", "customers")  # a contract's sections of column descriptions: text, not what data is drawn for


def _same_values_as_shipped(suite_name: str, settings: Settings) -> None:
    """A UsageError unless the contract cases would be generated with holds the values the suite's generator draws
    its data for: the shipped contract's, but for the columns' descriptions. Its clean batches are drawn inside
    the shipped limits, window and rules and its defective ones outside them, so with another cap, currency or
    window the labels contradict the contract the cases carry (careful, the reference, scored about 0.55)."""
    from ..kernel.contract import load_contract
    mine, shipped = load_contract(suite_name, settings.contracts_dir), load_contract(suite_name)
    changed = sorted(k for k in set(mine) | set(shipped) if k not in DESCRIBED and mine.get(k) != shipped.get(k))
    if changed:
        raise UsageError(f"the {suite_name} contract in {settings.contracts_dir} changes {changed[0]!r} from the shipped "
                         f"one: cases are generated for the shipped contract's values (their labels would contradict "
                         f"yours); generate with the shipped contracts, and try yours as variants (gate experiment)")


def cmd_cases_generate(a, settings: Settings) -> int:
    suite = suites.get(a.suite) if a.suite is not None else suites.default()
    splits = SPLITS if a.split == "both" else (a.split,)
    if a.rows is not None:
        if suite.rows is None:
            raise UsageError(f"--rows: the {suite.name} suite's batch sizes are fixed")
        least, most, _ = suite.rows
        int_arg("--rows", least, most)(str(a.rows))
    if a.out is not None and not a.out.strip():  # `--out "$UNSET"`: not the shipped folder in its place
        raise UsageError("--out is empty: give the folder to write the case files into, or leave --out out for "
                         f"cases/{suite.name}")
    out = a.out or f"cases/{suite.name}"
    there = path_state(out)
    if there not in ("missing", "directory"):
        raise UsageError(f"--out {out}: is a file; --out names the folder the case files are written into")
    if there == "directory":  # a file there that is not a case file (gate's begin '{"') is not overwritten
        for split in splits:
            output_file("--out", Path(out) / SPLIT_FILES[split], b'{"')
    _same_values_as_shipped(suite.name, settings)
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
                                                 "into (default: cases/SUITE); case files gate wrote there are "
                                                 "replaced, anything else is refused. The data is drawn for the "
                                                 "shipped contract's values: a GATE_CONTRACTS contract that changes "
                                                 "them is refused (try it as a variant)")
    gen.add_argument("--rows", type=int_arg("--rows"), default=None,
                     help="rows per batch, for a suite whose sizes scale (v2: 20 to 10,000,000; default 20)")
    gen.add_argument("--split", choices=("both", *SPLITS), default="both", help="which file(s) to write")
    gen.set_defaults(fn=cmd_cases_generate)
    from . import export
    export.register(csub)
