"""Suite v2 at real size: the same cases with batches of 20, 2,000 and 200,000 rows.

For each size, one case per v2 family (its eval variant 0, `gate cases generate --suite v2
--rows N` draws the same defects at any size) is written to a case file, then each case is
measured in a fresh process (so peak memory is that case's):

- **build**: `kernel.engine.prepare(case)` (the warehouse's past and the staged files into SQLite)
  next to SQLite's own bulk insert of the same rows: the same tables and index in a fresh
  database (opened inside the timing, as gate's is), `executemany` of the rows already parsed into
  Python lists, one transaction; the two taken in turns, each at least 3 times and up to 25 while
  BUILD_SECONDS last, the best of each.
- **tool calls**: careful-v2 plays the case through the engine's `Session`; for each of its
  `run_sql` calls, SQLite's own time for the same query on a copy of the database in the same
  state (no authorizer, no progress handler, the same fetch of up to 51 rows) is measured just
  before the call. overhead = (time of the calls through gate - SQLite's own time) / SQLite's
  own time, over all its run_sql calls. A line after each size's table says how much of gate's time
  beyond SQLite's went to the two checks a read makes once a batch or once a statement: the look check
  (the read run again with a batch emptied) and the compile check (the statement compiled first in the
  child, or found in its cache); the rest is each call's own work.
- **memory**: in another fresh process, after a 20-row episode of the same agent (so what any
  episode loads, pandas and pandera included, is loaded), peak resident memory (VmHWM, reset
  after the warm-up; ru_maxrss where it cannot be reset) above what the process then held, for
  reading the case, preparing it and careful-v2's episode (its DataFrames included), and for
  the same with the oracle (gate's own part: it reads little); next to the database's size (SQLite pages x page
  size). For the oracle also: the case's CSV text, the memory after reading the case and after building its
  database, and the pages its loads added to the database (its rollback journal keeps the pages they changed).
- **result**: careful-v2's reward (and the oracle's).

    .venv/bin/python benchmarks/bench_v2_size.py [--sizes 20,2000,200000] [--families f1,f2]

`--parts N` prints instead where the time of careful-v2's most frequent call goes (a page of 50
rows by rowid from an N-row batch, already looked at): SQLite alone, SQLite with a Python
authorizer that allows everything, the sandbox's guarded execution, with the result's rows
shaped, and the whole tool call, each the best of 7 passes; then the look check of a read that names a
batch not yet looked at and reads none of its rows (run again with the batch emptied), and a compile
check's round trip to its child for statements it has not seen, next to SQLite alone.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


BUILD_SECONDS = 1.0  # each side is built at least 3 times and, while this lasts, up to 25 (a millisecond's build
# on a shared machine needs more than three tries for its best)


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def reset_peak() -> bool:
    """Start the peak resident memory (VmHWM) afresh from the current resident memory (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_mb() -> float:
    """Peak resident memory in MB: VmHWM (since the last `reset_peak`), else the lifetime ru_maxrss."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # kB on Linux


# -- one case, in a worker process ---------------------------------------------------------------

def sqlite_bulk_insert_s(case) -> float:
    """SQLite's own time to take the case's rows: the same tables and index, rows already parsed."""
    from gate_pipeline.kernel.cases import staging_table
    from gate_pipeline.kernel.world import SPILL_CACHE_KIB
    from gate_pipeline.suites.v2.files import header_of, rows_of
    from gate_pipeline.suites.v2.layout import (
        INDEXES,
        LOAD_LOG_COLUMNS,
        WAREHOUSE_COLUMNS,
        WAREHOUSE_DDL,
    )
    warehouse = case.data["warehouse"]
    tables = [(f"wh_{t}", WAREHOUSE_COLUMNS[t], list(rows_of(warehouse[t]))) for t in ("customers", "orders")]
    log = [[None if v == "" else v for v in r] for r in rows_of(warehouse["load_log"])]
    tables.append(("wh_load_log", LOAD_LOG_COLUMNS, log))
    staged = [(staging_table(b.batch_id), header_of(b.data["csv"]), list(rows_of(b.data["csv"]))) for b in case.batches]
    t = time.perf_counter()  # from opening the database, as gate's build is timed
    conn = sqlite3.connect("", isolation_level=None)  # the same kind of database as gate's (kernel.world.connect)
    conn.execute(f"PRAGMA cache_size = -{SPILL_CACHE_KIB}")
    conn.execute("PRAGMA journal_mode = MEMORY")
    conn.execute("BEGIN")
    for ddl in WAREHOUSE_DDL:
        conn.execute(ddl)
    for name, cols, rows in tables:
        conn.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(cols))})", rows)
    for name, header, rows in staged:
        conn.execute(f"CREATE TABLE {name} ({', '.join(chr(34) + c + chr(34) + ' TEXT' for c in header)})")
        conn.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(header))})", rows)
    for ddl in INDEXES:
        conn.execute(ddl)
    conn.execute("COMMIT")
    seconds = time.perf_counter() - t
    conn.close()
    return seconds


class TimedTools:
    """careful-v2's tools, each run_sql preceded by the same query on a mirror database (raw SQLite)."""

    def __init__(self, tools, mirror):
        self.tools, self.mirror = tools, mirror
        self.gate_s = self.raw_s = 0.0
        self.calls = 0

    @property
    def tool_names(self):
        return self.tools.tool_names

    @property
    def suite(self):
        return self.tools.suite

    @property
    def episode_seed(self):
        return self.tools.episode_seed

    def __call__(self, name, **args):
        if name == "run_sql":
            from gate_pipeline.kernel.sandbox import normalise_query
            conn = self.mirror.world.conn
            gc.disable()  # both timings without a collection of the agent's heap that falls inside them
            try:
                t = time.perf_counter()
                cur = conn.execute(normalise_query(args["query"]))
                cur.fetchmany(51)
                cur.close()
                self.raw_s += time.perf_counter() - t
                t = time.perf_counter()
                result = self.tools(name, **args)
                self.gate_s += time.perf_counter() - t
            finally:
                gc.enable()
            self.calls += 1
            return result
        result = self.tools(name, **args)
        if name in ("load_batch", "quarantine_rows", "quarantine_batch", "cite_defect"):
            self.mirror.call(name, args)
        return result


def warm_up(agent: str) -> None:
    """A 20-row episode of another case first: what any episode loads (pandas and pandera, the compile
    check's child process) is loaded before anything is measured."""
    from gate_pipeline.kernel.cases import load_case
    from gate_pipeline.kernel.contract import load_contract
    from gate_pipeline.kernel.engine import play, prepare
    from gate_pipeline.suites.v2.generator import generate_case
    play(prepare(load_case(generate_case("warm-up", "partial-defect", 0, 1, load_contract("v2"), 20))), agent)


def measure_calls(case) -> dict:
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.suites.v2.agents import CarefulV2
    from gate_pipeline.suites.v2.tools import EpisodeV2
    warm_up("careful-v2")
    prepared = prepare(case)
    session = Session(prepared, "careful-v2")
    mirror = EpisodeV2(prepared)  # the prepared database is borrowed by the session: a copy of its own
    mirror.world.conn.set_authorizer(None)
    mirror.world.conn.set_progress_handler(None, 0)
    tools = TimedTools(session.tools, mirror)
    checks = _time_checks()
    t = time.perf_counter()
    CarefulV2().play(tools)
    play_s = time.perf_counter() - t
    result = session.finish()
    mirror.close()
    return {"run_sql_calls": tools.calls, "gate_s": tools.gate_s, "sqlite_s": tools.raw_s, "play_s": play_s,
            "calls": len(result.ledger), "reward": result.grade.reward, **checks}


def _time_checks() -> dict:
    """Time, from now on in this process, the two checks a read may make once a batch or once a statement: the
    look check (`SandboxV2._rerun_empty`: the read run again with a batch emptied) and the compile check
    (`CompileCheck.compiles_within`: its cache, or its child). Returns the dict the seconds are added to."""
    from gate_pipeline.kernel.compile_check import CompileCheck
    from gate_pipeline.suites.v2.sandbox import SandboxV2
    spent = {"look_s": 0.0, "compile_s": 0.0}
    for cls, name, key in ((SandboxV2, "_rerun_empty", "look_s"), (CompileCheck, "compiles_within", "compile_s")):
        def timed(*args, _fn=getattr(cls, name), _key=key, **kw):
            t = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                spent[_key] += time.perf_counter() - t
        setattr(cls, name, timed)
    return spent


def measure_memory(path: str, agent: str) -> dict:
    from gate_pipeline.kernel.agents import resolve_agent
    from gate_pipeline.kernel.cases import read_cases
    from gate_pipeline.kernel.engine import Session, prepare
    warm_up(agent)  # what any episode loads is loaded before the baseline
    reset_peak()  # the peak from here on, not the warm-up's
    base = rss_mb()
    t = time.perf_counter()
    case = read_cases(path)[0]
    read_s = time.perf_counter() - t
    read_mb = rss_mb() - base
    t = time.perf_counter()
    prepared = prepare(case)
    build_s = time.perf_counter() - t
    built_mb = rss_mb() - base
    session = Session(prepared, agent)  # play(prepared, agent), with a look at the database before it is given back
    played = resolve_agent(agent).build()
    played.play(session.tools, case.data if getattr(played, "oracle", False) else None)
    loaded_mb = prepared.database_bytes(session.episode.world.conn) / 1e6 - prepared.db_bytes / 1e6
    result = session.finish()
    text_mb = (sum(len(t) for t in case.data["warehouse"].values()) + sum(len(b.data["csv"]) for b in case.batches)) / 1e6
    return {"read_s": read_s, "build_s": build_s, "db_mb": prepared.db_bytes / 1e6, "peak_mb": peak_mb() - base,
            "reward": result.grade.reward, "text_mb": text_mb, "read_mb": read_mb, "built_mb": built_mb,
            "loaded_mb": loaded_mb}


def worker(mode: str, path: str) -> None:
    if mode == "memory-careful-v2":
        out = measure_memory(path, "careful-v2")
    elif mode == "memory-oracle":
        out = measure_memory(path, "oracle")
    else:
        from gate_pipeline.kernel.cases import read_cases
        from gate_pipeline.kernel.engine import prepare
        case = read_cases(path)[0]
        builds, inserts = [], []
        until = time.perf_counter() + BUILD_SECONDS
        while len(builds) < 3 or (len(builds) < 25 and time.perf_counter() < until):  # the two sides taken in turns
            inserts.append(sqlite_bulk_insert_s(case))
            t = time.perf_counter()
            prepared = prepare(case)
            builds.append(time.perf_counter() - t)
            prepared.close()
        out = {"build_s": min(builds), "insert_s": min(inserts), **measure_calls(case)}
    print(json.dumps(out))


# -- where one call's time goes ----------------------------------------------------------------

def parts(rows: int) -> None:
    from gate_pipeline.kernel.cases import load_case
    from gate_pipeline.kernel.compile_check import borrowed, catalogue
    from gate_pipeline.kernel.contract import load_contract
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.kernel.sandbox import _AGENT_LIMITS, Sandbox
    from gate_pipeline.suites.v2.generator import EVAL_BASE_SEED, generate_case
    from gate_pipeline.suites.v2.tools import EpisodeV2
    warm_up("careful-v2")
    prepared = prepare(load_case(generate_case("v2-parts", "partial-defect", 0, EVAL_BASE_SEED, load_contract("v2"),
                                               rows)))
    session = Session(prepared, "careful-v2")
    mirror = EpisodeV2(prepared)
    raw = mirror.world.conn
    raw.set_authorizer(None)
    raw.set_progress_handler(None, 0)
    sandbox = session.episode.world.sandbox
    staging = prepared.staging[max(prepared.order, key=prepared.row_counts.__getitem__)]  # the largest batch
    pages = [f"SELECT rowid, * FROM {staging} WHERE rowid > {50 * i} ORDER BY rowid LIMIT 50"
             for i in range(max(1, min(400, rows // 50)))]
    session.tools("run_sql", query=pages[0])  # the batch looked at: no page is looked at again

    def sqlite_alone(query):
        cur = raw.execute(query)
        cur.fetchmany(51)
        cur.close()

    def allowing(*_):
        return 0
    kinds = [("SQLite alone", None, sqlite_alone), ("  with a Python authorizer allowing all", allowing, sqlite_alone),
             ("sandbox: guarded execution", None, lambda q: Sandbox.execute(sandbox, q)),
             ("  and the rows shaped (Sandbox.run)", None, sandbox.run),
             ("the tool call (run_sql)", None, lambda q: session.tools("run_sql", query=q))]
    best = {name: float("inf") for name, _, _ in kinds}
    gc.disable()
    try:
        for _ in range(7):
            for name, authorizer, call in kinds:
                raw.set_authorizer(authorizer)
                t = time.perf_counter()
                for query in pages:
                    call(query)
                best[name] = min(best[name], (time.perf_counter() - t) / len(pages))
        raw.set_authorizer(None)
    finally:
        gc.enable()
    print(f"careful-v2's page read (50 rows by rowid) from a {rows:,}-row batch, microseconds a call, best of 7 "
          f"passes of {len(pages)} calls:")
    alone = best["SQLite alone"]
    for name, _, _ in kinds:
        print(f"  {name:<44}{best[name] * 1e6:8.1f}{best[name] / alone - 1:>9.1%}")
    # the look check: a read that names a batch no read has looked at yet, and reads none of its rows, is run
    # again with the batch emptied, every time (the batch stays undecided)
    other = next(prepared.staging[b] for b in prepared.order if prepared.staging[b] != staging)
    unread = f"SELECT * FROM {other} LIMIT 0"
    looks = {"SQLite alone": [], "the tool call (run_sql)": []}
    gc.disable()
    try:
        for _ in range(200):
            for name, call in (("SQLite alone", sqlite_alone),
                               ("the tool call (run_sql)", lambda q: session.tools("run_sql", query=q))):
                t = time.perf_counter()
                call(unread)
                looks[name].append(time.perf_counter() - t)
    finally:
        gc.enable()
    assert other in session.episode.world.sandbox.pending
    mid = {name: sorted(times)[len(times) // 2] * 1e6 for name, times in looks.items()}
    rows = prepared.row_counts[next(b for b in prepared.order if prepared.staging[b] == other)]
    print(f"the look check: a read that names a batch not yet looked at and reads none of its {rows:,} rows (SELECT * "
          f"FROM it LIMIT 0), run again with the batch emptied each time, microseconds a call, median of 200: the tool "
          f"call {mid['the tool call (run_sql)']:.1f}, SQLite alone {mid['SQLite alone']:.1f}")
    session.finish()
    mirror.close()
    # the compile check: statements with a subquery it has not seen, to its child and back
    conn = prepared.build()
    entries = catalogue(conn)
    statements = [f"WITH q(v) AS (SELECT DISTINCT customer_id FROM wh_orders WHERE order_id > '{i}') "
                  f"SELECT DISTINCT v FROM q ORDER BY v LIMIT 50" for i in range(200)]
    empty = sqlite3.connect(":memory:")
    for _, sql in entries:
        empty.execute(sql)
    with borrowed() as check:
        check.compiles_within(conn, "SELECT 1 FROM (SELECT 1)", 1.0, _AGENT_LIMITS, entries)  # its child started
        trips = []
        for query in statements:
            t = time.perf_counter()
            check.compiles_within(conn, query, 1.0, _AGENT_LIMITS, entries)
            trips.append(time.perf_counter() - t)
    own = []
    for query in statements:
        t = time.perf_counter()
        empty.execute(query).fetchall()
        own.append(time.perf_counter() - t)
    trips.sort()
    own.sort()
    print(f"the compile check's round trip for {len(statements)} statements with a subquery, microseconds: "
          f"best {trips[0] * 1e6:.1f}, median {trips[len(trips) // 2] * 1e6:.1f}; SQLite compiling and running "
          f"each on the schema, no rows: best {own[0] * 1e6:.1f}, median {own[len(own) // 2] * 1e6:.1f}")
    conn.close()


# -- the driver ----------------------------------------------------------------------------------

def run(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", mode, str(path)], capture_output=True, text=True,
                         check=False, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{mode} {path}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20,2000,200000")
    ap.add_argument("--families", default="")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "CASES"))
    ap.add_argument("--parts", type=int, default=0, metavar="ROWS",
                    help="print where the time of careful-v2's page read goes, at ROWS rows a batch")
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker)
        return 0
    from gate_pipeline.kernel.cases import write_cases
    from gate_pipeline.kernel.contract import load_contract
    from gate_pipeline.suites.v2.generator import (
        EVAL_BASE_SEED,
        FAMILIES,
        MAX_ROWS,
        MIN_ROWS,
        generate_case,
    )
    families = [f for f in a.families.split(",") if f] or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown family {unknown[0]!r}; families: {', '.join(FAMILIES)}")
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes must be whole numbers separated by commas, not {a.sizes!r}")
    if not all(MIN_ROWS <= n <= MAX_ROWS for n in sizes):
        ap.error(f"--sizes: each must be from {MIN_ROWS} to {MAX_ROWS:,}")
    if a.parts:
        if not MIN_ROWS <= a.parts <= MAX_ROWS:
            ap.error(f"--parts: from {MIN_ROWS} to {MAX_ROWS:,}")
        parts(a.parts)
        return 0
    contract = load_contract("v2")
    print(f"suite v2, one case per family (eval variant 0), each measured in fresh processes; "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            print(f"\nrows per batch: {size:,}")
            print(f"{'family':<20}{'db MB':>9}{'build s':>10}{'insert s':>10}{'build/ins':>10}"
                  f"{'sql calls':>10}{'overhead':>10}{'peak MB':>9}{'peak/db':>8}{'gate MB':>9}{'gate/db':>8}"
                  f"{'careful-v2':>11}{'oracle':>8}")
            totals = {"build": 0.0, "insert": 0.0, "gate": 0.0, "sqlite": 0.0, "look": 0.0, "compile": 0.0}
            worst_peak = worst_gate = 0.0
            rewards = []
            parts_of_gate = []
            for fi, family in enumerate(FAMILIES):
                if family not in families:
                    continue
                case = generate_case(f"v2-bench-{family}", family, 0, EVAL_BASE_SEED + 100 * fi, contract, size)
                path = Path(tmp) / f"{family}-{size}.jsonl"
                write_cases(path, [case])
                del case
                calls = run("calls", path)
                mem = run("memory-careful-v2", path)
                own = run("memory-oracle", path)
                totals["build"] += calls["build_s"]
                totals["insert"] += calls["insert_s"]
                totals["gate"] += calls["gate_s"]
                totals["sqlite"] += calls["sqlite_s"]
                totals["look"] += calls["look_s"]
                totals["compile"] += calls["compile_s"]
                worst_peak = max(worst_peak, mem["peak_mb"] / mem["db_mb"])
                worst_gate = max(worst_gate, own["peak_mb"] / own["db_mb"])
                rewards.append(mem["reward"])
                parts_of_gate.append((family, own))
                overhead = calls["gate_s"] / calls["sqlite_s"] - 1
                print(f"{family:<20}{mem['db_mb']:>9.1f}{calls['build_s']:>10.3f}{calls['insert_s']:>10.3f}"
                      f"{calls['build_s'] / calls['insert_s']:>9.2f}x{calls['run_sql_calls']:>10}{overhead:>9.1%}"
                      f"{mem['peak_mb']:>9.1f}{mem['peak_mb'] / mem['db_mb']:>7.2f}x{own['peak_mb']:>9.1f}"
                      f"{own['peak_mb'] / own['db_mb']:>7.2f}x{mem['reward']:>11.4f}{own['reward']:>8.4f}")
            print(f"{'all':<20}{'':>9}{totals['build']:>10.3f}{totals['insert']:>10.3f}"
                  f"{totals['build'] / totals['insert']:>9.2f}x{'':>10}{totals['gate'] / totals['sqlite'] - 1:>9.1%}"
                  f"{'':>9}{worst_peak:>7.2f}x{'':>9}{worst_gate:>7.2f}x{min(rewards):>11.4f}")
            beyond = totals["gate"] - totals["sqlite"]
            print(f"gate's run_sql time beyond SQLite's own, all families: {beyond:.3f} s; of it the look check "
                  f"{totals['look']:.3f} s ({totals['look'] / beyond:.0%}), the compile check {totals['compile']:.3f} s "
                  f"({totals['compile'] / beyond:.0%}), the rest (each call's own work) "
                  f"{beyond - totals['look'] - totals['compile']:.3f} s")
            print(f"gate's part (the oracle), over the database: {'text':>8}{'read':>8}{'built':>8}{'loaded':>8}{'peak':>8}")
            for family, own in parts_of_gate:
                print(f"  {family:<44}" + "".join(f"{own[k] / own['db_mb']:>7.2f}x"
                                                  for k in ("text_mb", "read_mb", "built_mb", "loaded_mb", "peak_mb")))
    print("\nbuild/ins: prepare(case) over SQLite's own bulk insert of the same rows (goal <= 1.5x); overhead: "
          "careful-v2's run_sql calls through gate over SQLite's own time for the same queries (goal <= 10 %); "
          "peak/db: peak memory over the database's size, reading the case and playing careful-v2 (gate/db: "
          "the oracle, gate's own part) (goal <= 2x); the 'all' row sums times and shows the worst ratio and "
          "the lowest reward. gate's part: the case's CSV text (which the caller holds), the memory after reading the "
          "case and after building its database, the pages the oracle's loads added to it, and the peak.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
