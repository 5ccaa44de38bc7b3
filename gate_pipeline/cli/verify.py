"""`gate verify`: every stored episode graded again from first principles; what does not hold, one line each.

    gate verify [--run runs/<run-id>] [--json]

Exit 0 when every check holds, 1 when any fails, 2 for bad input (a missing run directory...).
"""
from __future__ import annotations

from pathlib import Path

from ..kernel.settings import Settings
from .errors import UsageError


def cmd_verify(a, settings: Settings) -> int:
    from ..store import RunStore
    from ..verify import dumps, report, verify_store
    run_id = None
    if a.run is not None:
        run_dir = Path(a.run)
        if not run_dir.is_dir():
            raise UsageError(f"--run {a.run}: no such run directory")
        run_id = run_dir.name
    store = RunStore(settings)
    try:
        checked, problems, fresh = verify_store(store, run_id)
    finally:
        store.dispose()
    if a.run is not None:
        from ..model_agent.rollouts import TRANSCRIPTS, verify_transcripts
        if checked == 0:
            raise UsageError(f"--run {a.run}: the run store at {store.url} holds no episode of run {run_id!r}")
        problems += verify_transcripts(run_dir / TRANSCRIPTS, fresh)
    result = report(checked, problems)
    if a.json:
        print(dumps(result))
    else:
        for p in problems:
            print(p.line())
        bad = result["episodes_with_problems"]
        where = f"run {run_id}" if run_id else store.url
        print(f"{checked} episodes checked in {where}: " + (f"{bad} with problems ({len(problems)} in all)" if problems
                                                            else "every check holds"))
    return 1 if problems else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("verify", help="grade every stored episode again and check it was not altered",
                              description="Every stored episode (under GATE_HOME, or GATE_DB_URL) graded again from "
                                          "its stored ledger and warehouse; one line per failed check; exit 1 if any.",
                              epilog="examples:\n  gate verify\n  gate verify --run runs/20261130T120000Z-my-model")
    p.add_argument("--run", default=None, metavar="DIR", help="only the episodes of this `gate run` directory "
                                                               "(runs/<run-id>), and its transcripts")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_verify)
