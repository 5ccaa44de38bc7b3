"""`gate verify`: every stored result derived again (gate_pipeline/verify.py); what does not hold, one line each.

    gate verify [--run runs/<run-id>] [--key-file FILE] [--json]

Exit 0 when every check holds, 1 when any fails, 2 for bad input (a missing run directory, a key
file that is not a key...). A key that sits beside the database it seals is one warning line.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..kernel.settings import Settings, expanded_path
from .errors import UsageError


def cmd_verify(a, settings: Settings) -> int:
    from ..store import RunStore
    from ..verify import dumps, key_warning, report, verify_store
    run_id = None
    if a.run is not None:
        run_dir = Path(a.run)
        if not run_dir.is_dir():
            raise UsageError(f"--run {a.run}: no such run directory")
        run_id = run_dir.name
    if a.key_file is not None:  # the key held apart from the store: it wins over GATE_STORE_KEY
        key_file = expanded_path(a.key_file, f"--key-file {a.key_file}", UsageError).absolute()
        settings = dataclasses.replace(settings, store_key=None, store_key_file=key_file)
    store = RunStore(settings, check_key=False)
    try:
        warning = key_warning(store)
        if warning:
            print(f"gate: warning: {warning}", file=sys.stderr)
        result = verify_store(store, run_id, settings)
        if a.run is not None:
            from ..model_agent.rollouts import TRANSCRIPTS, verify_transcripts
            if result.checked == 0:
                raise UsageError(f"--run {a.run}: the run store at {store.url} holds no episode of run {run_id!r}")
            result.problems += verify_transcripts(run_dir / TRANSCRIPTS, store, run_id, result.fresh)  # type: ignore[arg-type]
    finally:
        store.dispose()
    out = report(result)
    if a.json:
        print(dumps(out))
    else:
        for p in result.notes:
            print(f"note: {p.line()}")
        for p in result.problems:
            print(p.line())
        c = result.counts
        print(f"played again {c['replayed']}, tied to a transcript {c['tied']}, warehouses rebuilt {c['rebuilt']}; "
              f"runs against their manifests {c['runs']}, nights recomputed {c['nights']}, kept grades {c['grades']}")
        bad = out["episodes_with_problems"]
        where = f"run {run_id}" if run_id else store.url
        print(f"{result.checked} episodes checked in {where}: "
              + (f"{bad} with problems ({len(result.problems)} in all)" if result.problems else "every check holds"))
    return 1 if result.problems else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("verify", help="derive every stored result again and check nothing was altered",
                              description="Every stored episode (under GATE_HOME, or GATE_DB_URL) checked against its "
                                          "seal, its warehouse rebuilt from its ledger, played again when its agent is "
                                          "deterministic (a model's ledger tied to its transcript), graded again; every "
                                          "sealed run against its manifest, every nightly summary recomputed. One line "
                                          "per failed check; exit 1 if any (docs/integrity.md).",
                              epilog="examples:\n  gate verify\n  gate verify --key-file /secure/gate.key\n"
                                     "  gate verify --run runs/20261130T120000Z-my-model")
    p.add_argument("--run", default=None, metavar="DIR", help="only the episodes of this `gate run` directory "
                                                               "(runs/<run-id>), and its transcripts")
    p.add_argument("--key-file", default=None, metavar="FILE",
                   help="the store's key, from a file kept away from the database (default: GATE_STORE_KEY, "
                        "GATE_STORE_KEY_FILE, else GATE_HOME/store.key)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_verify)
