"""How much the run store grows a night: `gate nightly` over the 320 train cases x naive, careful, refuse-all
(960 episodes), night after night on one store, and the store's size after each night, table by table.

On SQLite (a fresh GATE_HOME) the sizes are the pages each table and index takes (SQLite's `dbstat`), read after
the night's write-ahead log is copied into the database; with --postgres, on a PostgreSQL server started on
127.0.0.1 for the run (tests/servers.py), each table's `pg_total_relation_size` (its TOAST and indexes included).

    .venv/bin/python benchmarks/bench_store_size.py [--nights 2] [--cases N] [--postgres]
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/servers.py: PostgreSQL
sys.path.insert(0, str(ROOT))

from gate_pipeline.kernel.cases import read_cases, write_cases  # noqa: E402

TRAIN = ROOT / "cases" / "classic" / "train_procedural.jsonl"
AGENTS = "naive,careful,refuse-all"
KEY = "bench-store-size-store-key-0123456789abcdef"
GATE = str(Path(sys.executable).parent / "gate")
MB = 1e6


def night(cases_file: Path, env: dict) -> None:
    p = subprocess.run([GATE, "nightly", "--cases", str(cases_file), "--agents", AGENTS, "--json"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    if p.returncode:
        sys.exit(f"gate nightly failed: {p.stderr.strip()[-400:]}")


def sqlite_sizes(database: Path) -> dict[str, int]:
    conn = sqlite3.connect(database)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        rows = conn.execute("SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat d "
                            "LEFT JOIN sqlite_schema m ON m.name = d.name GROUP BY 1").fetchall()
    finally:
        conn.close()
    return dict(rows)


def postgres_sizes(url: str) -> dict[str, int]:
    from sqlalchemy import create_engine, text
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return dict(c.execute(text("SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables")).all())
    finally:
        engine.dispose()


def show(backend: str, n: int, sizes: dict[str, int], before: int) -> int:
    total = sum(sizes.values())
    big = sorted(sizes.items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{name} {size / MB:.1f}" for name, size in big if size >= 0.05 * MB)
    print(f"{backend:10s} after night {n}: {total / MB:6.1f} MB (+{(total - before) / MB:.1f})   {parts}", flush=True)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=2)
    ap.add_argument("--cases", type=int, default=0, help="the first N train cases (default: all 320)")
    ap.add_argument("--postgres", action="store_true", help="also on a PostgreSQL server on 127.0.0.1")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-bench-store-") as tmp:
        measure(Path(tmp), a.cases, a.nights, a.postgres)
    return 0


def measure(work: Path, count: int, nights: int, on_postgres: bool) -> None:
    cases = read_cases(TRAIN)[:count or None]
    cases_file = write_cases(work / "train.jsonl", cases)
    print(f"{len(cases)} train cases x {AGENTS} = {len(cases) * 3} episodes a night; sizes in MB (tables with their "
          f"indexes; those of 0.05 MB or more named)", flush=True)
    env = {**os.environ, "GATE_HOME": str(work / "sqlite"), "GATE_STORE_KEY": KEY}
    before = 0
    for n in range(1, nights + 1):
        night(cases_file, env)
        before = show("sqlite", n, sqlite_sizes(work / "sqlite" / "runs.db"), before)
    if on_postgres:
        from servers import postgres
        with postgres() as pg:
            url = pg.create_database(f"gate_{uuid.uuid4().hex[:12]}")
            env = {**os.environ, "GATE_HOME": str(work / "pg"), "GATE_STORE_KEY": KEY, "GATE_DB_URL": url}
            before = 0
            for n in range(1, nights + 1):
                night(cases_file, env)
                before = show("postgresql", n, postgres_sizes(url), before)


if __name__ == "__main__":
    sys.exit(main())
