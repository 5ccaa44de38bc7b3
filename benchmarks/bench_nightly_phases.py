"""Where `gate nightly`'s time goes beyond playing: one night over the 320 train cases x naive, careful,
refuse-all, in this process (imports timed from its start), with the night's parts timed by wrapping
the functions that do them (the play, the run store's writes, Dagster's instance, the wait for the page,
which a process of its own draws); then `gate report --workers 1` of the same episodes as a command, for
comparison.

    .venv/bin/python benchmarks/bench_nightly_phases.py [--postgres]

With --postgres the run store is a PostgreSQL server started on 127.0.0.1 for the run (tests/servers.py).
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/servers.py: PostgreSQL
sys.path.insert(0, str(ROOT))

import gate_pipeline.cli.main as cli  # noqa: E402

T1 = time.perf_counter()
gc.disable()  # as `gate nightly` imports them: the collector paused
import dagster as dg  # noqa: E402

import gate_pipeline.dagster_defs.definitions  # noqa: E402, F401

T2 = time.perf_counter()
gc.enable()
import gate_pipeline.dagster_defs.scoreboard as scoreboard  # noqa: E402
import gate_pipeline.html_report as html_report  # noqa: E402
import gate_pipeline.store as store  # noqa: E402

TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"
ARGS = ["--cases", str(TRAIN), "--agents", "naive,careful,refuse-all", "--json"]
KEY = "bench-nightly-phases-store-key-0123456789abcdef"
spent: dict[str, float] = {}
PLAY, STORE = "playing the episodes (the store's writes included)", "  of which the run store's writes"
PAGE = "waiting for the page's process to draw the scoreboard page"
FIGURES, INSTANCE = "the scoreboard's figures", "Dagster's ephemeral instance"


def timed(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
    setattr(owner, name, wrapper)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--postgres", action="store_true")
    a = ap.parse_args()
    timed(scoreboard, "play_cases", PLAY)
    timed(store.RunStore, "end_episodes", STORE)
    timed(html_report.PageProcess, "wait", PAGE)
    timed(scoreboard, "summary", FIGURES)
    timed(dg.DagsterInstance, "ephemeral", INSTANCE)
    os.environ.update(GATE_HOME=tempfile.mkdtemp(prefix="gate-bench-phases-"), GATE_STORE_KEY=KEY)
    pg = None
    if a.postgres:
        from servers import postgres
        pg = postgres()
        os.environ["GATE_DB_URL"] = pg.__enter__().create_database(f"gate_{uuid.uuid4().hex[:12]}")
    try:
        t = time.perf_counter()
        with open(os.devnull, "w") as null:
            out, sys.stdout = sys.stdout, null
            try:
                code = cli.main(["nightly", *ARGS])
            finally:
                sys.stdout = out
        night = time.perf_counter() - t
        if code:
            sys.exit(f"gate nightly exited {code}")
        total = T2 - T0 + night  # the imports and the night (not the PostgreSQL server's start)
        os.environ["GATE_HOME"] = tempfile.mkdtemp(prefix="gate-bench-phases-")
        t = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "gate"), "report", *ARGS, "--workers", "1"], check=True,
                       stdout=subprocess.DEVNULL, cwd=ROOT)
        report = time.perf_counter() - t
    finally:
        if pg is not None:
            pg.__exit__(None, None, None)
    rest = night - sum(v for k, v in spent.items() if not k.startswith(" "))
    print(f"gate nightly on {'PostgreSQL' if a.postgres else 'SQLite'}: {total:.2f} s in all "
          f"(`gate report --workers 1` just after: {report:.2f} s)")
    parts = [PLAY, STORE, PAGE, FIGURES, INSTANCE]
    for label, seconds in [("importing gate's command line", T1 - T0),
                           ("importing Dagster and gate's definitions", T2 - T1),
                           *((p, spent.get(p, 0.0)) for p in parts),
                           ("the rest of the night (Dagster's run, steps, outputs; the store's opens)", rest)]:
        print(f"  {label:72s} {seconds:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
