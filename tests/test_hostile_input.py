"""Bad input never hurts: a query cannot step over the sandbox's budgets, and every malformed case
file, trajectory file, variant file or action is one clear error (one line and exit 2 on the command
line, an error observation from the env, a tool error for an agent), never a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate_pipeline.integrations.gymnasium_env import GateEnv
from gate_pipeline.kernel import sandbox
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import prepare

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "cases" / "classic" / "eval_curated.jsonl"
GATE = str(Path(sys.executable).parent / "gate")
BUDGET = sandbox.TIME_BUDGET_S + 0.5


def Episode(case):
    """An episode of a case, as its suite plays it."""
    prepared = prepare(case)
    return prepared.suite.episode(prepared)


@pytest.fixture(scope="module")
def case():
    return read_cases(EVAL)[8]


def timed_sql(episode, query):
    t0 = time.perf_counter()
    result = episode.call("run_sql", {"query": query})
    return result, time.perf_counter() - t0


@pytest.mark.parametrize("query", [
    "SELECT printf('%.*c', 1000000000, 'x')",
    "SELECT format('%.*c', 1000000000, 'x')",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r WHERE n<10) "
    "SELECT length(printf('%.*c', 500000000, 'x')) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT count(*) FROM r",
    "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s||s FROM r) SELECT length(s) FROM r",
    "SELECT count(*) FROM wh_orders a, wh_orders b, wh_orders c, wh_orders d, wh_orders e, wh_orders f",
    "SELECT 1 WHERE 1 IN (" + ",".join(["1"] * 2_000_000) + ")",
])
def test_every_query_returns_within_the_budget(case, query):
    episode = Episode(case)
    result, seconds = timed_sql(episode, query)
    assert "error" in result and seconds < BUDGET, (result, seconds)
    logged = episode.ledger.entries[-1]
    assert not logged["executed"] and len(logged["args"]["query"]) <= sandbox.LEDGER_QUERY_CHARS + 40
    episode.close()


def test_a_long_query_is_refused_before_sqlite_sees_it_and_logged_bounded(case):
    episode = Episode(case)
    query = "SELECT 1 WHERE 1 IN (" + ",".join(["1"] * 5_000_000) + ")"  # 10 MB
    result, seconds = timed_sql(episode, query)
    assert result == {"error": f"query is {len(query):,} characters long; the limit is {sandbox.MAX_QUERY_CHARS:,}"}
    entry = episode.ledger.entries[-1]
    assert entry["note"] == "query too long" and entry["args"]["query"].endswith(f"...[{len(query):,} characters]")
    assert seconds < 0.5
    at_limit = "SELECT 1 WHERE 1 IN (" + ",".join(["1"] * 4_000) + ")"
    assert len(at_limit) < sandbox.MAX_QUERY_CHARS and "rows" in episode.call("run_sql", {"query": at_limit})
    episode.close()


def test_a_huge_query_does_not_cost_memory_to_refuse(tmp_path):
    code = ("import resource, json\n"
            "from gate_pipeline.kernel.cases import read_cases\nfrom gate_pipeline.kernel.engine import prepare\n"
            f"p = prepare(read_cases({str(EVAL)!r})[0])\n"
            "ep = p.suite.episode(p)\n"
            "q = 'SELECT ' + '1+' * 50_000_000 + '1'\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(json.dumps([ep.call('run_sql', {'query': q}), before,"
            " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    result, before, after = json.loads(out.stdout)
    assert "limit is" in result["error"] and after - before < 50_000  # KiB: nothing near the query's 100 MB again


def gate(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_CASES_DIR", "GATE_CONTRACTS")}
    return subprocess.run([GATE, *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def one_line(p, needle):
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gate: error:") and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def case_file(tmp_path, edit, name="cases.jsonl"):
    case = json.loads(EVAL.read_text().splitlines()[8])
    edit(case)
    path = tmp_path / name
    path.write_text(json.dumps(case) + "\n")
    return path


def _first_batch(case):
    return case["batches"][0]


def _rows(case):
    return _first_batch(case)["rows"]


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c["batches"][1].update(batch_id=c["batches"][0]["batch_id"].lower()), "would share the staging table"),
    (lambda c: _rows(c)[0].update(order_id="O1\ud800"), "lone surrogate"),
    (lambda c: _first_batch(c).update(table=["orders"]), "'table' must be one of"),
    (lambda c: _rows(c)[0].update(amount="inf"), "finite number"),
    (lambda c: _rows(c)[0].update(amount="nan"), "finite number"),
    (lambda c: _rows(c)[0].update(amount="1e400"), "finite number"),
    (lambda c: _rows(c)[0].update(status="x" * 30_000), "characters long"),
    (lambda c: c.update(prompt="x" * 30_000), "'prompt' is 30,000 characters long"),  # a string: not "must be one"
    (lambda c: _first_batch(c).update(source="s\ud800"), "'source' is not valid Unicode text"),
    (lambda c: c.update(case_id=["eval-x"]), "'case_id' must be"),
    (lambda c: c["contract"]["limits"].update(max_amount=10 ** 400), "limits.max_amount"),
    (lambda c: c["contract"].update(extra_rules="none"), "unknown key 'extra_rules'"),
])
def test_a_malformed_case_file_is_one_line(tmp_path, edit, needle):
    one_line(gate("report", "--cases", str(case_file(tmp_path, edit)), "--json"), needle)


def test_huge_integers_in_files_are_one_line(tmp_path):
    big = "9" * 5000
    line = EVAL.read_text().splitlines()[8].replace('"seed": ', f'"seed": {big}, "x": ', 1)
    (tmp_path / "big.jsonl").write_text(line + "\n")
    one_line(gate("report", "--cases", str(tmp_path / "big.jsonl")), "not a case")
    (tmp_path / "t.jsonl").write_text('{"case_id": "eval-amount-bounds-0", "calls": [' + big + ']}\n')
    one_line(gate("replay", "--trajectories", str(tmp_path / "t.jsonl")), "t.jsonl:1")


def test_a_list_as_case_id_in_a_replay_file_is_one_line(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"case_id": ["eval-amount-bounds-0"], "calls": []}\n')
    one_line(gate("replay", "--trajectories", str(tmp_path / "t.jsonl")), "'case_id' must be a non-empty string")


@pytest.mark.parametrize("text, needle", [
    ("variant:\n  base: classic\n  description: big\n  overrides:\n    limits:\n      max_amount: " + "9" * 5000 + "\n",
     "not a usable variant"),
    ("variant: " + "[" * 20000 + "]" * 20000 + "\n", "nested deeper than"),
    ("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nvariant: [*b, *b]\n", "anchors and aliases are not allowed"),
    ("variant:\n  base: classic\n  description: d\nextra: 1\n", "unknown key 'extra'"),
    ("variant:\n  base: classic\n  description: d\n1: a\nb: c\n", "unknown key '1'"),  # keys of two types: a traceback
])
def test_a_hostile_variant_file_is_one_line(tmp_path, text, needle):
    contracts = tmp_path / "contracts"
    (contracts / "variants").mkdir(parents=True)
    (contracts / "classic.yaml").write_text((ROOT / "contracts" / "classic.yaml").read_text())
    (contracts / "variants" / "bad.yaml").write_text(text)
    env = {**os.environ, "GATE_CONTRACTS": str(contracts)}
    p = subprocess.run([GATE, "experiment"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    one_line(p, needle)


@pytest.mark.parametrize("kind, words", [("directory", "bad.yaml: is a directory, not a variant file"),
                                         ("device", "bad.yaml: is no regular file, not a variant file")])
def test_a_variant_entry_that_is_no_file_says_so(tmp_path, kind, words):
    """A directory or a link to /dev/zero named like a variant was listed as a variant and called unknown in one
    breath: `unknown variant 'bad'; variants in ...: bad`."""
    contracts = tmp_path / "contracts"
    (contracts / "variants").mkdir(parents=True)
    (contracts / "classic.yaml").write_text((ROOT / "contracts" / "classic.yaml").read_text())
    if kind == "directory":
        (contracts / "variants" / "bad.yaml").mkdir()
    else:
        (contracts / "variants" / "bad.yaml").symlink_to("/dev/zero")
    env = {**os.environ, "GATE_CONTRACTS": str(contracts)}
    p = subprocess.run([GATE, "experiment", "--variants", "bad"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env=env)
    one_line(p, words)


def test_the_variant_list_leaves_out_hidden_files_which_no_name_loads(tmp_path):
    """A hidden `.draft.yaml` was listed as the variant '.draft', which no name can load: every experiment over all
    the variants failed with `unknown variant '.draft'; variants in ...: ..., .draft`. Hidden files are not
    variants now. An entry that is no regular file is still listed, so loading every variant says what it is."""
    from gate_pipeline.kernel.contract import ContractError
    from gate_pipeline.kernel.variants import load_variants, variant_names
    contracts = tmp_path / "contracts"
    (contracts / "variants").mkdir(parents=True)
    (contracts / "classic.yaml").write_text((ROOT / "contracts" / "classic.yaml").read_text())
    full = (ROOT / "contracts" / "variants" / "full.yaml").read_text()
    (contracts / "variants" / "full.yaml").write_text(full)
    (contracts / "variants" / ".draft.yaml").write_text(full)
    assert variant_names(contracts) == ["full"]
    assert [v.name for v in load_variants(None, contracts)] == ["full"]
    (contracts / "variants" / "dir.yaml").mkdir()
    assert variant_names(contracts) == ["full", "dir"]
    with pytest.raises(ContractError, match="dir.yaml: is a directory, not a variant file"):
        load_variants(None, contracts)


def test_a_replay_names_the_line_of_an_unknown_case_and_refuses_a_key_named_twice(tmp_path):
    """An unknown case id was said without its line (the docs promise the file and the line); an object naming a key
    twice was read as its last value, where `gate serve` refuses it: one reading of a trajectory, whoever reads it."""
    (tmp_path / "u.jsonl").write_text('{"case_id": "eval-amount-bounds-0", "calls": []}\n'
                                      '{"case_id": "zzz", "calls": []}\n')
    one_line(gate("replay", "--trajectories", str(tmp_path / "u.jsonl")), "u.jsonl:2: no case 'zzz' in ")
    (tmp_path / "d.jsonl").write_text('{"case_id": "nope", "case_id": "eval-amount-bounds-0", "calls": []}\n')
    one_line(gate("replay", "--trajectories", str(tmp_path / "d.jsonl")),
             "d.jsonl:1: not valid JSON (names the key 'case_id' twice in one object)")


def test_a_tool_calls_arguments_are_read_as_they_were_when_a_stored_transcript_was_played():
    """A model's arguments are read as Python's json reads them (a key named twice is its last value), unlike a
    trajectory line or a served frame: `gate verify` plays a stored transcript again through this parser, and one
    an older gate stored must read as it did then (reading them strictly failed honest stores as forged)."""
    from gate_pipeline.kernel.actions import parse_arguments
    assert parse_arguments("profile_batch", '{"batch_id": "B-1", "batch_id": "B-2"}') == (
        "profile_batch", {"batch_id": "B-2"}, None, None)


def test_deeply_nested_actions_are_error_observations(case):
    env = GateEnv([case])
    env.reset(options={"case_id": case.case_id})
    deep_text = '{"tool": "run_sql", "args": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}"
    assert len(deep_text) < 10_000
    deep_dict: dict = {"a": 1}
    for _ in range(5000):
        deep_dict = {"a": deep_dict}
    for action in (deep_text, {"tool": "run_sql", "args": deep_dict}, {"tool": "no_such", "args": deep_dict},
                   ["run_sql", {"query": "SELECT 1", "x": deep_dict}]):
        obs, reward, terminated, truncated, info = env.step(action)
        assert "error" in json.loads(obs["result"]) and not terminated
    entries = env.session.episode.ledger.entries
    assert all(len(json.dumps(e["args"])) < 1000 for e in entries)  # what was sent, kept bounded
    env.close()


def test_oversized_arguments_are_tool_errors(case):
    episode = Episode(case)
    assert "limit is 200" in episode.call("load_batch", {"batch_id": "B" * 10_000})["error"]
    assert "at most 1000 ids" in episode.call("submit_report", {"loaded": ["x"] * 2000, "quarantined": []})["error"]
    assert "unknown tool" in episode.call("t" * 100_000, {})["error"]
    assert all(len(e["action"]) <= 120 and len(json.dumps(e["args"])) < 1000 for e in episode.ledger.entries)
    assert episode.world.report is None and not episode.world.loads
    episode.close()


def test_report_json_is_strict_json(tmp_path):
    p = gate("report", "--json", "--agents", "naive,careful-sql")
    json.loads(p.stdout, parse_constant=lambda name: pytest.fail(f"{name} in gate report --json"))


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "nobody-writes"
    os.mkfifo(path)
    return path


@pytest.fixture
def never_hang():
    """A command that blocks fails the test after 20 s instead of hanging the suite."""
    import signal

    def hung(*_):
        raise TimeoutError("the command blocked")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


@pytest.mark.parametrize("command", [["report"], ["attacks"], ["experiment"], ["nightly"],
                                     ["replay", "--trajectories", str(ROOT / "examples" / "dense_replay.jsonl")]])
@pytest.mark.parametrize("where", ["fifo", "/dev/zero", "/tmp"])
def test_a_case_file_that_is_no_regular_file_is_refused_before_it_is_read(command, where, fifo, never_hang, capsys):
    from gate_pipeline.cli.main import main
    path = str(fifo) if where == "fifo" else where
    assert main([*command, "--cases", path]) == 2
    err = capsys.readouterr().err
    kind = {"fifo": "a FIFO", "/dev/zero": "a character device", "/tmp": "a directory"}[where]
    assert err == f"gate: error: {path}: is {kind}, not a case file (only regular files are read)\n"


def test_other_files_gate_is_handed_are_refused_when_no_regular_file(fifo, never_hang, tmp_path, capsys, monkeypatch):
    from gate_pipeline.cli.main import main
    assert main(["replay", "--trajectories", str(fifo)]) == 2
    assert f"{fifo}: is a FIFO, not a trajectory file" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["replay", "--trajectories", str(empty)]) == 2
    assert f"{empty}: no trajectories in the file" in capsys.readouterr().err
    contracts = tmp_path / "contracts"
    (contracts / "variants").mkdir(parents=True)
    for f in (ROOT / "contracts").glob("*.yaml"):
        (contracts / f.name).write_text(f.read_text())
    os.mkfifo(contracts / "variants" / "stuck.yaml")
    monkeypatch.setenv("GATE_CONTRACTS", str(contracts))
    for command in (["report", "--agents", "careful@stuck"], ["experiment"]):  # a variant file that is a FIFO
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "variants/stuck.yaml: is no regular file, not a variant file" in err


def test_a_row_with_a_column_its_table_does_not_have_is_refused_naming_it(tmp_path, capsys):
    from gate_pipeline.cli.main import main
    obj = json.loads(EVAL.read_text().splitlines()[8])
    obj["batches"][0]["rows"][0]["x" * 100_000] = "1"  # a 100 KB column name
    path = tmp_path / "extra.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    assert main(["report", "--cases", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400
    assert "batch 0: row 0 has a column orders does not have: 'xxxx" in err and "[100,002 characters]" in err


@pytest.mark.parametrize("out", ["a-file", "/proc/nope"])
def test_cases_generate_out_errors_are_one_line(tmp_path, capsys, out):
    from gate_pipeline.cli.main import main
    target = tmp_path / out if out == "a-file" else Path(out)
    if out == "a-file":
        target.write_text("")
    assert main(["cases", "generate", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gate: error: --out {target}: ")


def test_a_case_file_is_read_in_the_memory_it_needs_not_its_limit(tmp_path):
    """A case file was read with read(limit + 1): Python allocates that buffer first, 4 GiB, so every command
    failed with a MemoryError traceback in a process whose address space is limited (a container, ulimit -v)."""
    import resource
    one = tmp_path / "one.jsonl"
    one.write_text(EVAL.read_text().splitlines()[0] + "\n")

    def limited():  # 3 GB of address space: gate and its imports fit many times over, a 4 GiB buffer does not
        resource.setrlimit(resource.RLIMIT_AS, (3 * 10**9, 3 * 10**9))

    p = subprocess.run([sys.executable, "-m", "gate_pipeline.cli.main", "report", "--cases", str(one), "--agents",
                        "naive", "--json"], capture_output=True, text=True, timeout=120, preexec_fn=limited)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(json.loads(p.stdout)["agents"]["naive"]) == 1


def test_a_file_that_grows_while_it_is_read_is_read_on_to_its_limit():
    import io

    from gate_pipeline.kernel.files import _read_up_to
    assert _read_up_to(io.BytesIO(b"abc"), 3, 10) == b"abc"
    assert _read_up_to(io.BytesIO(b"ab"), 3, 10) == b"ab"  # shrank
    assert _read_up_to(io.BytesIO(b"abcdef"), 3, 10) == b"abcdef"  # grew: read on
    assert _read_up_to(io.BytesIO(b"x" * 50), 3, 10) == b"x" * 11  # grew past the limit: one byte over, refused


@pytest.mark.parametrize("where", ["--cases", "--key-file", "GATE_HOME", "GATE_STORE_KEY_FILE", "GATE_CASES_DIR"])
def test_a_symlink_loop_is_one_line(tmp_path, monkeypatch, capsys, where):
    """A path that is a loop of links: Path.resolve raised RuntimeError, a traceback."""
    from gate_pipeline.cli.main import main
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    loop = str(tmp_path / "loop1")
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    args = {"--cases": ["report", "--cases", loop], "--key-file": ["verify", "--key-file", loop]}.get(
        where, ["verify"] if where != "GATE_CASES_DIR" else ["report"])
    if where.startswith("GATE_"):
        monkeypatch.setenv(where, loop)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error: ") and err.count("\n") == 1 and "loop1" in err, err


@pytest.mark.parametrize("command", [["report", "--agents", "naive", "--html"], ["nightly", "--agents", "naive", "--html"],
                                     ["cases", "export", "--format", "jsonl-chat", "--run", "RUN"]])
def test_an_output_that_is_a_fifo_or_a_file_gate_did_not_write_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                                           capsys, command):
    """--html FIFO (and export's OUT) waited for a reader for ever; --html naming the run store overwrote it."""
    from gate_pipeline.cli.main import main
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    one = tmp_path / "one.jsonl"
    one.write_text(EVAL.read_text().splitlines()[0] + "\n")
    (tmp_path / "RUN").mkdir()
    fifo, store = tmp_path / "out.fifo", tmp_path / "runs.db"
    os.mkfifo(fifo)
    store.write_bytes(b"SQLite format 3\x00" + bytes(100))
    cases = ["--cases", str(one)] if command[0] != "cases" else []
    for target, words in ((fifo, "is not a regular file"), (store, "a file is there that gate did not write")):
        args = [a if a != "RUN" else str(tmp_path / "RUN") for a in command] + [str(target)] + cases
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("gate: error: ") and words in err and err.count("\n") == 1, err
    assert store.read_bytes().startswith(b"SQLite format 3")  # left as it was
    if command[0] == "report":  # a page gate wrote is written over
        page = tmp_path / "page.html"
        assert main(command + [str(page)] + cases) == 0 and main(command + [str(page)] + cases) == 0
        assert page.read_text().startswith("<!DOCTYPE html>")
        assert main(command + [os.devnull] + cases) == 0  # written to be thrown away


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_json_lines_are_split_at_newlines_only(tmp_path, char):
    """A JSON string may hold U+2028, U+0085 ... as they are; str.splitlines split a valid line there, and the
    case file or trajectory was refused as broken JSON ("Unterminated string starting at at column ...")."""
    from gate_pipeline.kernel.actions import parse_trajectories
    case = json.loads(EVAL.read_text().splitlines()[0])
    case["prompt"] += f" ({char})"
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(case, ensure_ascii=False) + "\n", encoding="utf-8")
    assert char in path.read_text(encoding="utf-8") and read_cases(path)[0].prompt == case["prompt"]
    line = json.dumps({"case_id": case["case_id"], "calls": [{"tool": "run_sql", "args": {"query": f"SELECT '{char}'"}}]},
                      ensure_ascii=False)
    assert parse_trajectories(line + "\n", "t.jsonl")[0][1][0]["args"]["query"] == f"SELECT '{char}'"
    path.write_text('{"case_id": "x", "prompt": "unterminated\n', encoding="utf-8")
    with pytest.raises(Exception, match=r"Unterminated string starting at column \d+"):
        read_cases(path)


def test_the_replay_help_describes_the_trajectory_the_parser_reads(capsys):
    from gate_pipeline.cli.main import main
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = capsys.readouterr().out
    assert '"calls": [' in text and '"actions"' not in text.replace("\n", "")


def _workers_of(proc, count=2, seconds=60):
    """The pids of `proc`'s worker processes once `count` of them run."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if len(found) >= count:
            time.sleep(0.5)  # playing
            return [int(pid) for pid in found]
        time.sleep(0.1)
    raise AssertionError("the workers did not start")


def _gone(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") and
                                              "Z" not in open(f"/proc/{pid}/stat").read().split(")")[-1][:3]
                                              for pid in pids):
        time.sleep(0.1)
    return not any(os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split(")")[-1][:3]
                   for pid in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pgrep, /proc and the parent-death signal")
@pytest.mark.parametrize("how", ["a worker killed", "SIGINT to gate alone", "SIGTERM to gate"])
def test_workers_never_outlive_or_hang_gate(how):
    """`gate report --workers 2`: a worker killed ended gate with a BrokenProcessPool traceback; SIGINT to gate
    alone waited for the workers' chunks; SIGTERM to gate left both workers (and their compile-check children)
    playing on for nobody."""
    import signal
    v2 = ROOT / "cases" / "v2" / "train_procedural.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "gate_pipeline.cli.main", "report", "--cases", str(v2),
                             "--workers", "2", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        workers = _workers_of(proc)
        started = time.monotonic()
        if how == "a worker killed":
            os.kill(workers[0], signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGINT if how.startswith("SIGINT") else signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
        assert time.monotonic() - started < 5, err  # not waiting for the other worker's chunks
        assert _gone(workers), "a worker plays on"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)  # strays of a failure: its session
    assert "Traceback" not in err, err
    if how == "a worker killed":
        assert proc.returncode == 2 and err.startswith("gate: error: a worker process ended without answering ") and \
            err.count("\n") == 1, err
    elif how.startswith("SIGINT"):
        assert proc.returncode == 130 and err.strip() == "gate: interrupted", err
    else:
        assert proc.returncode == -signal.SIGTERM


@pytest.mark.parametrize("key,value", [("case_id", "evil\nTraceback (most recent call last):"), ("case_id", "\x1b[2Jx"),
                                       ("case_id", "a\u2028b"), ("batch_id", "B-1\x85"), ("batch_id", "B\x7f"),
                                       ("case_id", "abc\u202egnp.exe"), ("batch_id", "B-1\u200b")])
def test_an_id_that_is_not_printable_is_refused_in_one_line(tmp_path, key, value):
    """An id is printed in tables, errors and verify's lines: a newline in one forged lines of gate's output (a
    three-line 'gate: error:'), an escape sequence cleared the terminal, a right-to-left override showed
    another id than the one stored, a zero-width space two ids that look the same."""
    from gate_pipeline.kernel.cases import CaseError
    case = json.loads(EVAL.read_text().splitlines()[0])
    if key == "case_id":
        case["case_id"] = value
    else:
        case["batches"][0]["batch_id"] = value
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(case) + "\n")
    with pytest.raises(CaseError) as caught:
        read_cases(path)
    assert f"'{key}' must be a non-empty string of at most 200 printable characters" in str(caught.value)
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)
    from gate_pipeline.kernel.cases import printable
    assert printable(value).isprintable()  # as verify prints what a store holds


@pytest.mark.parametrize("char", ["\n", "\x1b", "\u202e", "\xa0", "\u3000", "\U000e0041", "\ue000", "\u0378",
                                  "\ud800", "\U0010ffff"])
def test_what_gate_prints_of_a_stored_name_shows_every_character_it_holds(char):
    """verify prints stored ids and names through `printable`, which escaped a fixed list of characters while ids
    are refused by `str.isprintable`: a tag character (U+E0041, invisible, it spells text no one sees), a private-use
    or unassigned code point or a no-break space was printed as it is."""
    from gate_pipeline.kernel.cases import bad_id, printable
    shown = printable(f"id{char}x")
    assert shown.isprintable() and shown != f"id{char}x" and bad_id(f"id{char}x")
    assert printable("plain id, with spaces: ok") == "plain id, with spaces: ok"


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(),
                    reason="gate as PID 1 needs unshare and root")
def test_workers_play_when_gate_is_pid_1(tmp_path):
    """In a container gate is PID 1: each worker's parent is PID 1, and a worker took that for a parent gone."""
    cases = tmp_path / "four.jsonl"
    cases.write_text("\n".join(EVAL.read_text().splitlines()[:4]) + "\n")
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "gate_pipeline.cli.main",
                        "report", "--cases", str(cases), "--agents", "naive", "--workers", "2", "--json"],
                       capture_output=True, text=True, timeout=300)
    if "Operation not permitted" in p.stderr:
        pytest.skip("no PID namespace here")
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(json.loads(p.stdout)["agents"]["naive"]) == 4


def test_a_failed_export_leaves_the_file_it_names_as_it_was(tmp_path, monkeypatch, capsys):
    """cases export emptied its OUT (an earlier export) before it found --run had no transcripts. (A case file
    named by mistake is refused before that: test_a_file_that_is_no_case_file_is_not_overwritten...)"""
    from gate_pipeline.cli.main import main
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    out = tmp_path / "earlier.jsonl"
    earlier = '{"messages": [], "tools": [], "case_id": "c", "reward": 1.0}\n'
    out.write_text(earlier)
    assert main(["cases", "export", "--format", "jsonl-chat", "--run", str(tmp_path / "nothing"), str(out)]) == 2
    assert "no transcripts.jsonl there" in capsys.readouterr().err and out.read_text() == earlier
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def _a_file(edits: dict[int, str], count: int = 12) -> str:
    """The first `count` eval cases, one a line, with line N (from 1) replaced by edits[N]; 'dup:K' repeats
    line K's case, 'v2' is a case of suite v2."""
    lines = EVAL.read_text().splitlines()[:count]
    v2 = (ROOT / "cases" / "v2" / "train_procedural.jsonl").read_text().split("\n", 1)[0]
    for n, edit in edits.items():
        lines[n - 1] = lines[int(edit[4:]) - 1] if edit.startswith("dup:") else v2 if edit == "v2" else edit
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("edits", [
    {9: "{not json"}, {10: "dup:2"}, {4: "dup:1", 11: "{"}, {11: "dup:1", 5: "[1"}, {5: "{", 6: "dup:1"},
    {5: "dup:1", 6: "{"}, {7: '{"case_id": "x"}'}, {12: "v2"}, {12: "v2", 3: "dup:1"}, {1: "v2", 12: "{"},
    {n: "  " for n in range(1, 13)}, {3: "9" * 5000}], ids=str)
def test_workers_parsing_their_share_refuse_a_bad_file_as_reading_it_whole_does(tmp_path, edits):
    """`gate report --json` hands its workers the case file's lines, each worker parsing its share: the error
    is the one reading the whole file first gives (the first in file order; a repeated id across shares;
    two suites once every share is read)."""
    from gate_pipeline.kernel.cases import CaseError, CaseLines, suite_of_cases
    from gate_pipeline.kernel.engine import play_cases
    path = tmp_path / "cases.jsonl"
    path.write_text(_a_file(edits))
    with pytest.raises(CaseError) as whole:
        suite_of_cases(read_cases(path))
    for workers in (1, 2, 5):
        with pytest.raises(CaseError) as shared:
            play_cases(CaseLines.read(path), ["naive"], workers=workers)
        assert str(shared.value) == str(whole.value), workers
    p = subprocess.run([GATE, "report", "--cases", str(path), "--agents", "naive", "--workers", "2", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and p.stderr == f"gate: error: {whole.value}\n", p.stderr


@pytest.mark.parametrize("edits", [{12: "{"}, {12: "v2"}, {12: "dup:1"}], ids=str)
def test_workers_play_nothing_of_a_file_with_a_bad_line(tmp_path, edits):
    """Each worker checks its share of the lines, and none plays until every share is good: a bad last line was
    refused only after every case before it had been played (a model agent's calls paid for nothing)."""
    from gate_pipeline.kernel.cases import CaseError, CaseLines
    from gate_pipeline.kernel.engine import play_cases
    path = tmp_path / "cases.jsonl"
    path.write_text(_a_file(edits))
    played: list[None] = []
    with pytest.raises(CaseError):
        play_cases(CaseLines.read(path), ["naive"], workers=3, progress=lambda: played.append(None))
    assert played == []
    path.write_text(_a_file({}))
    results = play_cases(CaseLines.read(path), ["naive"], workers=3, progress=lambda: played.append(None))
    assert len(played) == len(results["naive"]) == 12


def test_a_share_reads_each_contract_as_the_whole_file_does(tmp_path):
    """A case whose contract equals the one of the case before it is not checked again (`true == 1` in Python):
    a worker's first case was checked for want of a case before it, so a file was refused or not by where the
    workers' shares began (an outside review's). A share now reads the contract of the line before it; and the
    same contract is the same JSON value, types included (tests/test_workers.py), so such a file is refused alike
    however it is read, and one whose contracts differ is played alike."""
    from gate_pipeline.kernel.cases import CaseError, CaseLines
    from gate_pipeline.kernel.engine import play_cases
    path = tmp_path / "cases.jsonl"
    for other in (True, 2):
        lines = _a_file({}).splitlines()
        for n, line in enumerate(lines):
            case = json.loads(line)
            case["contract"]["limits"]["max_amount"] = other if n in (2, 4, 7) else 1
            lines[n] = json.dumps(case)
        path.write_text("\n".join(lines) + "\n")
        if other is True:
            with pytest.raises(CaseError) as whole:
                read_cases(path)
            for workers in (2, 3, 4, 6, 12):
                with pytest.raises(CaseError) as shared:
                    play_cases(CaseLines.read(path), ["naive"], workers=workers)
                assert str(shared.value) == str(whole.value) and ":3 " in str(whole.value)
            continue
        played = [r.grade for r in play_cases(read_cases(path), ["naive"])["naive"]]
        for workers in (2, 3, 4, 6, 12):
            assert [r.grade for r in play_cases(CaseLines.read(path), ["naive"], workers=workers)["naive"]] == played


@pytest.mark.parametrize("suite,where", [("classic", "defects"), ("classic", "accepted"), ("v2", "accepted")])
def test_a_truth_list_that_is_not_a_list_is_refused_in_one_line(tmp_path, suite, where):
    """`"defects": 5` in a classic batch's truth (or a v2 defect's `"accepted": 5`) was a TypeError traceback."""
    from gate_pipeline.kernel.cases import CaseError
    source = EVAL if suite == "classic" else ROOT / "cases" / "v2" / "train_procedural.jsonl"
    case = json.loads(source.read_text().split("\n", 1)[0])
    truth = case["batches"][0]["truth"]
    if suite == "v2":
        truth = next(b["truth"] for b in case["batches"] if b["truth"]["defects"])["defects"][0]
    truth[where] = 5
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(case) + "\n")
    with pytest.raises(CaseError, match=f"{where} must be a list"):
        read_cases(path)


def test_what_an_agent_prints_in_a_worker_reaches_gates_output(tmp_path):
    """A worker ends without the interpreter's teardown (os._exit): what an agent printed there, still in the
    worker's buffer, was lost."""
    (tmp_path / "chatty_agent.py").write_text(
        "class Chatty:\n"
        "    def play(self, tools, case=None):\n"
        "        print('chatty-played', flush=False)\n"
        "        tools('submit_report', loaded=[], quarantined=[])\n")
    cases = tmp_path / "cases.jsonl"
    cases.write_text(_a_file({}, count=6))
    p = subprocess.run([GATE, "report", "--cases", str(cases), "--agents", "chatty_agent:Chatty", "--workers", "2"],
                       capture_output=True, text=True, timeout=120,
                       env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
                            "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("chatty-played") == 6


def test_how_deep_a_case_line_may_nest_does_not_depend_on_the_callers_stack(tmp_path):
    """json's parser stops at Python's recursion limit, counted from wherever it is called: a line nested about
    970 deep was a case when the file was read whole and 'nested too deep' in a worker (an outside review's).
    Every way of reading a file now draws the line at the same depth."""
    from gate_pipeline.kernel.cases import CaseError, CaseLines
    from gate_pipeline.kernel.engine import play_cases
    path = tmp_path / "cases.jsonl"

    def deep(levels, fn):  # the same read from a caller 400 frames deeper
        return fn() if levels == 0 else deep(levels - 1, fn)

    reads = [lambda: read_cases(path), lambda: deep(400, lambda: read_cases(path)),
             lambda: play_cases(CaseLines.read(path), ["naive"], workers=2)["naive"]]
    seen = set()
    for nesting in range(560, 1001, 40):
        lines = EVAL.read_text().splitlines()[:12]
        lines[6] = lines[6][:-1] + ', "zz": ' + "[" * nesting + "]" * nesting + "}"
        path.write_text("\n".join(lines) + "\n")
        outcomes = []
        for read in reads:
            try:
                outcomes.append(len(read()))
            except CaseError as exc:
                outcomes.append(str(exc))
        assert len(set(outcomes)) == 1, (nesting, outcomes)
        seen.add(outcomes[0])
    assert 12 in seen and any("nested too deep" in str(o) for o in seen)  # the line is drawn within the range


def test_a_defect_raised_in_a_worker_is_raised_with_where_it_was_raised(monkeypatch):
    """A worker sent the exception alone: the parent's traceback named none of the worker's frames; and an
    exception that does not survive pickling (a share's, before any case plays) came back as an AttributeError
    of the parent's own."""
    from gate_pipeline.kernel import cases as cases_module
    from gate_pipeline.kernel import engine
    from gate_pipeline.kernel.cases import CaseLines
    cases = read_cases(EVAL)[:6]
    real_prepare = engine.prepare

    def helper_that_breaks(case):
        if case.case_id == cases[4].case_id:
            return 1 / 0
        return real_prepare(case)

    monkeypatch.setattr(engine, "prepare", helper_that_breaks)  # the workers fork with it
    with pytest.raises(ZeroDivisionError) as caught:
        engine.play_cases(cases, ["naive"], workers=2)
    assert isinstance(caught.value.__cause__, engine.WorkerTraceback)
    assert "helper_that_breaks" in str(caught.value.__cause__)
    monkeypatch.setattr(engine, "prepare", real_prepare)

    class Unpicklable(ValueError):
        def __init__(self, text, why):
            super().__init__(text)
            self.why = why

    real_load = cases_module.load_case

    def load_breaking(obj, where="case", checked=None):
        if obj.get("case_id") == cases[4].case_id:
            raise Unpicklable("unpicklable defect", lambda: None)
        return real_load(obj, where, checked)

    monkeypatch.setattr(cases_module, "load_case", load_breaking)
    text = "".join(c.line() for c in cases)
    with pytest.raises(Exception, match="unpicklable defect") as caught:
        engine.play_cases(CaseLines(text, "x.jsonl"), ["naive"], workers=2)
    assert not isinstance(caught.value, AttributeError)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE as Linux counts it")
def test_more_workers_than_file_descriptors_allow_is_one_line(tmp_path):
    """Each worker holds a pipe: asked for more than the process's descriptors allow, gate ended in an OSError
    traceback (an outside review's: 45 workers under `ulimit -n 128`)."""
    import resource
    cases = tmp_path / "cases.jsonl"
    cases.write_text(_a_file({}, count=32))
    p = subprocess.run([GATE, "report", "--cases", str(cases), "--agents", "naive", "--workers", "32", "--json"],
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48)))
    assert p.returncode == 2 and p.stderr.startswith("gate: error: could not start 32 worker processes") \
        and p.stderr.count("\n") == 1, p.stderr


# -- found by an outside review of the command line -------------------------------------------------------

@pytest.mark.parametrize("name, make, words", [
    ("run.json", "fifo", "run.json: is a FIFO, not a run description (only regular files are read)"),
    ("tools.json", "fifo", "tools.json: is a FIFO, not a tools file (only regular files are written)"),
    ("run.json", "[" * 100_000, "run.json: not a run description (JSON nested too deep)"),
    ("run.json", '{"settings": null}', "run.json: not a run description ('settings' is not an object)"),
    ("run.json", '{"settings": [1]}', "run.json: not a run description ('settings' is not an object)"),
    ("run.json", '{}', "run.json: not a run description (not a JSON object with 'settings')"),
    ("run.json", '[1]', "run.json: not a run description (not a JSON object with 'settings')"),
    ("run.json", '{"settings"', "run.json: not a run description (not JSON: Expecting ':' delimiter"),
])
def test_a_run_directory_whose_files_are_hostile_is_one_line_never_a_hang(tmp_path, monkeypatch, capsys, never_hang,
                                                                         name, make, words):
    """A FIFO as run.json or tools.json held `gate run` in open() for ever (SIGTERM did not end it); a run.json
    nested too deep or whose settings are no object was a traceback."""
    from gate_pipeline.cli.main import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    if make == "fifo":
        os.mkfifo(run / name)
    else:
        (run / name).write_text(make)
    assert main(["run", "--model", "m", "--base-url", "http://127.0.0.1:1/v1", "--run-id", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error: ") and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("args, env, words", [
    (["report", "--agents", "...:x"], {}, "cannot import ...:x (TypeError: "),
    (["report", "--agents", ".foo:x"], {}, "cannot import .foo:x (TypeError: "),
    (["report"], {"GATE_SUITES": ".:x"}, "GATE_SUITES: cannot import .:x (TypeError: "),
    (["nightly", "--agent-options", "[" * 100_000], {}, "--agent-options is not JSON gate reads (nested too deep)"),
    (["report"], {"GATE_HOME": "~nobody-gate-knows/x"}, "GATE_HOME=~nobody-gate-knows/x: cannot expand"),
    (["verify", "--key-file", "~nobody-gate-knows/k"], {}, "--key-file ~nobody-gate-knows/k: cannot expand"),
])
def test_names_gate_cannot_import_or_expand_are_one_line(tmp_path, monkeypatch, capsys, args, env, words):
    """Each was a traceback: a relative module name (TypeError), JSON nested too deep (RecursionError), a home
    directory of no user (RuntimeError)."""
    from gate_pipeline.cli.main import main
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    one = tmp_path / "one.jsonl"
    one.write_text(EVAL.read_text().splitlines()[0] + "\n")
    cases = ["--cases", str(one)] if args[0] != "verify" else []
    assert main([*args, *cases]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error: ") and err.count("\n") == 1 and words in err, err


def test_a_file_that_is_no_case_file_is_not_overwritten_by_generate_or_export(tmp_path, capsys):
    """`gate cases generate --out DIR` wrote over any eval_curated.jsonl there, and `gate cases export
    --format jsonl-chat OUT` over a case file or another run's transcripts (both begin '{"')."""
    from gate_pipeline.cli.main import main
    (tmp_path / "eval_curated.jsonl").write_text("precious\n")
    assert main(["cases", "generate", "--suite", "classic", "--split", "eval", "--out", str(tmp_path)]) == 2
    assert "a file is there that gate did not write" in capsys.readouterr().err
    assert (tmp_path / "eval_curated.jsonl").read_text() == "precious\n"
    (tmp_path / "RUN").mkdir()
    (tmp_path / "RUN" / "transcripts.jsonl").write_text("")
    for kept in (EVAL.read_text().splitlines()[0] + "\n", '{"run_id": "r1", "key": "k"}\n'):
        target = tmp_path / "kept.jsonl"
        target.write_text(kept)
        assert main(["cases", "export", "--format", "jsonl-chat", str(target), "--run", str(tmp_path / "RUN")]) == 2
        assert "a file is there that gate did not write" in capsys.readouterr().err
        assert target.read_text() == kept


def test_stored_nightly_summaries_cannot_forge_lines_of_the_history(tmp_path, monkeypatch, capsys):
    """A stored summary's agent names and case file were printed as they were (a newline made a line of its own, an
    escape coloured the terminal), and a reward of -1e308 as 300 digits. (One edited without the store's key is not
    shown at all: tests/test_forgery.py.)"""
    import sqlite3

    from gate_pipeline.cli.main import main
    from gate_pipeline.store import RunStore
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    one = tmp_path / "one.jsonl"
    one.write_text(EVAL.read_text().splitlines()[0] + "\n")
    assert main(["nightly", "--cases", str(one), "--agents", "naive"]) == 0
    forged = {"agents": {"naive\nnight    7  forged  careful 1.0000": {"reward": 0.5}, "\x1b[31mRED": {"reward": -1e308}},
              "cases_file": "a\rb"}
    db = sqlite3.connect(tmp_path / "home" / "runs.db")
    db.execute("DELETE FROM nightly_scores")
    db.commit()
    db.close()
    store = RunStore()  # sealed, as a writer with the key keeps it: an edit without the key is never shown at all
    try:
        store.add_nightly(forged, "forged-run")
    finally:
        store.dispose()
    capsys.readouterr()
    assert main(["nightly", "--cases", str(one), "--agents", "naive"]) == 0
    out = capsys.readouterr().out
    history = out[out.index("nightly history"):]
    assert "\x1b" not in history and "\r" not in history
    assert not any(line.startswith("night    7") for line in history.splitlines())
    assert "naive\\nnight" in history and "\\x1b[31mRED ?" in history


def _night(tmp_path) -> subprocess.CompletedProcess:
    """`gate nightly` of two cases and naive under tmp_path/home, in a process of its own (a store this process
    opened stays open and ready in it)."""
    one = tmp_path / "one.jsonl"
    if not one.exists():
        one.write_text("".join(line + "\n" for line in EVAL.read_text().splitlines()[:2]))
    return subprocess.run([GATE, "nightly", "--cases", str(one), "--agents", "naive"], capture_output=True, text=True,
                          env={**os.environ, "GATE_HOME": str(tmp_path / "home")}, timeout=120)


def _one_night(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    night = _night(tmp_path)
    assert night.returncode == 0, night.stderr[-2000:]
    return tmp_path / "home" / "runs.db"


def test_gate_verify_leaves_a_store_it_refuses_byte_for_byte(tmp_path, monkeypatch, capsys):
    """A reader changes nothing: `gate verify` switched a store it then refused (schema 3) to WAL, rewriting the
    file's header, and left -wal and -shm files beside it."""
    import hashlib
    import sqlite3

    from gate_pipeline.cli.main import main
    db = _one_night(tmp_path, monkeypatch)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE gate_store SET value = '3' WHERE key = 'schema'")
    conn.commit()
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    capsys.readouterr()
    assert main(["verify"]) == 2
    assert "has schema 3" in capsys.readouterr().err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in db.parent.glob("runs.db*")) == ["runs.db"]


def test_migrating_a_schema_3_store_reads_only_warehouse_files_under_gate_home(tmp_path, monkeypatch):
    """The migration read whatever path a stored row named: a FIFO hung it, /dev/zero filled the memory."""
    import sqlite3

    db = _one_night(tmp_path, monkeypatch)
    os.mkfifo(tmp_path / "stuck")
    conn = sqlite3.connect(db)
    conn.execute("UPDATE gate_store SET value = '3' WHERE key = 'schema'")
    conn.execute("DELETE FROM warehouses")
    for statement in ("DROP TABLE manifests", "ALTER TABLE episodes DROP COLUMN agent_name",
                      "ALTER TABLE episodes DROP COLUMN transcript_sha256"):
        conn.execute(statement)
    ids = [r[0] for r in conn.execute("SELECT rowid FROM episodes ORDER BY rowid")]
    for rowid, name in zip(ids, (str(tmp_path / "stuck"), "/dev/zero", "../../etc/hostname")):
        conn.execute("UPDATE episodes SET warehouse = ? WHERE rowid = ?", (name, rowid))
    conn.commit()
    conn.close()
    night = _night(tmp_path)  # migrated, and the night played
    assert night.returncode == 0, night.stderr[-2000:]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM gate_store WHERE key = 'schema'").fetchone()[0] != "3"
    assert conn.execute("SELECT count(*) FROM warehouses WHERE episode_id IN (SELECT episode_id FROM episodes "
                        "WHERE rowid IN (?, ?))", ids[:2]).fetchone()[0] == 0  # nothing read from them
    conn.close()


def test_a_case_file_that_changes_while_the_night_plays_fails_the_night(tmp_path, monkeypatch, capsys):
    """Each chunk read the case file again and played what it found there: a file changed mid-night gave a night
    of two files' cases, stored, scored and sealed complete, exit 0."""
    from gate_pipeline.cli.main import main
    from gate_pipeline.dagster_defs import scoreboard
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    mid = tmp_path / "mid.jsonl"
    lines = EVAL.read_text().splitlines()
    mid.write_text("".join(line + "\n" for line in lines[:4]))
    seal = scoreboard.manifest_body

    def then_change(*args):  # once the night is planned and sealed, another file takes its place
        body = seal(*args)
        mid.write_text("".join(line + "\n" for line in lines[4:8]))
        return body
    monkeypatch.setattr(scoreboard, "manifest_body", then_change)
    assert main(["nightly", "--cases", str(mid), "--agents", "naive", "--chunk-size", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "changed while the night played" in err and "Failure" not in err, err
    from gate_pipeline.kernel.settings import Settings
    from gate_pipeline.store import RunStore
    store = RunStore(Settings.from_env())
    try:
        assert store.nightly_history() == []  # no night scored
    finally:
        store.dispose()


def test_a_run_named_by_a_relative_case_file_is_verified_from_anywhere(tmp_path):
    """The manifest kept the case file's name as given (`one.jsonl`), so `gate verify` run from elsewhere said it
    had changed since the run was sealed, and its check turned into a note."""
    (tmp_path / "one.jsonl").write_text("".join(line + "\n" for line in EVAL.read_text().splitlines()[:2]))
    env = {**os.environ, "GATE_HOME": str(tmp_path / "home")}
    night = subprocess.run([GATE, "nightly", "--cases", "one.jsonl", "--agents", "naive"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=120)
    assert night.returncode == 0, night.stderr[-2000:]
    (tmp_path / "elsewhere").mkdir()
    checked = subprocess.run([GATE, "verify"], capture_output=True, text=True, env=env, cwd=tmp_path / "elsewhere",
                             timeout=120)
    assert checked.returncode == 0 and "changed since" not in checked.stdout + checked.stderr, checked


@pytest.mark.parametrize("args, words", [
    (["report", "--cases", ""], "--cases is empty"),  # it played the eval split in its place
    (["report", "--agents", "x" * 100_000], "an agent name is at most 500 characters, not 100,000"),  # quoted whole
    (["serve", "--port", "0", "--token", "ab\ncd"], "the token holds a character that is not printable"),
])
def test_an_empty_case_file_name_a_huge_agent_name_or_an_unsendable_token_is_one_short_line(capsys, args, words):
    from gate_pipeline.cli.main import main
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error: ") and err.count("\n") == 1 and len(err) < 400 and words in err, err[:300]


@pytest.mark.parametrize("where", ["--cases", "--html", "GATE_CONTRACTS", "GATE_CASES_DIR", "GATE_HOME", "GATE_DB_URL",
                                   "cases generate --out", "cases export --format hf"])
def test_a_path_too_long_for_the_system_is_one_line(tmp_path, monkeypatch, capsys, where):
    """Path.exists() and is_dir() raise on a name too long for the system (Python 3.11): a traceback."""
    from gate_pipeline.cli.main import main
    long = str(tmp_path / ("a" * 5000))
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    args = {"--cases": ["report", "--agents", "naive", "--cases", long],
            "--html": ["report", "--agents", "naive", "--html", long],
            "cases generate --out": ["cases", "generate", "--out", long],
            "cases export --format hf": ["cases", "export", "--format", "hf", long]}.get(where, ["report", "--agents", "naive"])
    if where.startswith("GATE_"):
        monkeypatch.setenv(where, f"sqlite:///{long}" if where == "GATE_DB_URL" else long)
        if where in ("GATE_DB_URL", "GATE_HOME"):  # (a report keeps nothing under GATE_HOME)
            args = ["verify"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error: ") and err.count("\n") == 1, err[:300]


def test_cases_generate_refuses_an_empty_out_rather_than_writing_the_shipped_folder(tmp_path, monkeypatch, capsys):
    from gate_pipeline.cli.main import main
    monkeypatch.chdir(tmp_path)
    assert main(["cases", "generate", "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err and not (tmp_path / "cases").exists()


def test_an_exports_tools_file_that_is_no_regular_file_is_never_waited_on(tmp_path, monkeypatch, fifo, never_hang,
                                                                          capsys):
    """`gate cases export --format jsonl-chat` read a run's tools.json unguarded: a FIFO there was waited on for
    ever, a link to /dev/zero read until the process was killed."""
    from gate_pipeline.cli.main import main
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "home"))
    run = tmp_path / "r1"
    run.mkdir()
    (run / "transcripts.jsonl").write_text("")
    os.rename(fifo, run / "tools.json")
    main(["cases", "export", "--format", "jsonl-chat", str(tmp_path / "sft.jsonl"), "--run", str(run)])
    (run / "tools.json").unlink()
    (run / "tools.json").symlink_to("/dev/zero")
    main(["cases", "export", "--format", "jsonl-chat", str(tmp_path / "sft.jsonl"), "--run", str(run)])
    assert "Traceback" not in capsys.readouterr().err


def test_cases_are_not_generated_for_a_contract_whose_values_the_generator_does_not_draw_for(tmp_path, monkeypatch,
                                                                                            capsys):
    """The generators draw data for the shipped contract's limits and window: with another cap the clean batches
    broke the contract the cases carried, and careful scored about 0.55 on its own reference cases."""
    import shutil

    import yaml

    from gate_pipeline.cli.main import main
    from gate_pipeline.kernel.contract import SHIPPED_CONTRACTS, load_contract
    contracts = tmp_path / "contracts"
    shutil.copytree(SHIPPED_CONTRACTS, contracts)
    monkeypatch.setenv("GATE_CONTRACTS", str(contracts))
    doc = load_contract("classic")
    doc["orders"]["amount"] = "the amount, in the currency below"  # a description: text, nothing drawn for it
    (contracts / "classic.yaml").write_text(yaml.safe_dump(doc))
    assert main(["cases", "generate", "--out", str(tmp_path / "ok")]) == 0
    other = tmp_path / "other"  # (a contract file is read once per process: another folder)
    shutil.copytree(contracts, other)
    monkeypatch.setenv("GATE_CONTRACTS", str(other))
    doc["limits"]["max_amount"] = 0.001
    (other / "classic.yaml").write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert main(["cases", "generate", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "changes 'limits' from the shipped one" in err and err.count("\n") == 1 and not (tmp_path / "no").exists()


# -- whole-number flags: one parser, digits only, every one bounded ------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["report", "--agents", "naive", "--workers", "2_0"], "--workers must be a whole number, not '2_0'"),
    (["report", "--agents", "naive", "--workers", "\u0663"], "--workers must be a whole number, not '\u0663'"),
    (["report", "--agents", "naive", "--workers", " 2"], "--workers must be a whole number, not ' 2'"),
    (["report", "--agents", "naive", "--workers", "100000"], "--workers must be from 1 to 256, not 100,000"),
    (["attacks", "--workers", "100000"], "--workers must be from 1 to 256"),
    (["report", "--agents", "random", "--reward", "dense", "--seed", "x"], "--seed must be a whole number, not 'x'"),
    (["report", "--agents", "random", "--reward", "dense", "--seed", "9" * 30], "--seed must be from"),
    (["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--retries", "99999999999"],
     "--retries must be from 0 to 100"),
    (["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--retries", "three"],
     "--retries must be a whole number, not 'three'"),
])
def test_whole_number_flags_take_digits_within_bounds(argv, words, capsys):
    """`int()` read '2_0' as 20 and an Arabic-Indic three as 3; --workers 100000 forked a process per case;
    --retries had no bound (a dead server retried, with backoff, for ever) and, like --seed, was argparse's own
    message rather than gate's."""
    from gate_pipeline.cli.main import main
    assert main([*argv, "--cases", str(EVAL)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: error: ") and words in err and err.count("\n") == 1, err


def test_one_whole_number_parser_for_flags_and_cursors():
    """The CLI's flags and the grading sensor's cursor read whole numbers through one function: ASCII digits only,
    a bounded count of them, a sign only where one is allowed."""
    from gate_pipeline.kernel.numbers import MAX_DIGITS, whole_number
    assert [whole_number(t) for t in ("7", "+7", "-7", "007")] == [7, 7, -7, 7]
    assert [whole_number(t) for t in ("", "-", "+-7", "2_0", " 2", "\u0663", "\u00b2", "7.0", None, 7)] == [None] * 10
    assert whole_number("9" * MAX_DIGITS) == int("9" * MAX_DIGITS) and whole_number("9" * (MAX_DIGITS + 1)) is None
    assert whole_number("9" * 18, digits=18, signed=False) == int("9" * 18)
    assert whole_number("9" * 19, digits=18, signed=False) is None and whole_number("-1", signed=False) is None


def test_model_settings_bound_the_retries():
    from gate_pipeline.model_agent.agent import MAX_RETRIES, ModelSettings, SettingsError
    ModelSettings(model="m", base_url="http://127.0.0.1:9/v1", retries=MAX_RETRIES)
    with pytest.raises(SettingsError, match=f"retries must be a whole number from 0 to {MAX_RETRIES}"):
        ModelSettings(model="m", base_url="http://127.0.0.1:9/v1", retries=MAX_RETRIES + 1)


def test_open_regular_is_the_one_way_to_open_what_gate_is_handed(tmp_path):
    """Reading a file (`read_bytes`) and taking a run's lock (`store.hold_lock`) open it the same way: at once,
    whatever is there, and only a regular file is kept open."""
    from gate_pipeline.kernel.files import NotRegular, open_regular
    fifo, plain = tmp_path / "fifo", tmp_path / "plain"
    os.mkfifo(fifo)
    plain.write_text("x")
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory"), (Path("/dev/null"), "a character device")):
        with pytest.raises(NotRegular) as caught:
            open_regular(path)
        assert caught.value.kind == kind
    fd, found = open_regular(plain)
    os.close(fd)
    assert found.st_size == 1
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")
