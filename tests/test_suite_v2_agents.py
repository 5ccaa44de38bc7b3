"""Suite v2's baselines and attackers on its eval split, and one engine under every surface for v2:
gate report, the gymnasium env, gate replay of the env's calls and a Dagster case run agree."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import dagster as dg
import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.kernel.agents import AgentSpec, make_agent
from gate_pipeline.kernel.cases import load_case, read_cases
from gate_pipeline.kernel.engine import play, play_cases, prepare
from gate_pipeline.kernel.grading import exact_mean
from gate_pipeline.kernel.suite import suites
from gate_pipeline.suites.v2 import ATTACKERS as V2_ATTACKERS
from gate_pipeline.suites.v2 import SHORTCUTS
from gate_pipeline.suites.v2.attackers import LoadLogOnly, fetch_values_or_none
from gate_pipeline.suites.v2.generator import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
V2_EVAL = ROOT / "cases" / "v2" / "eval_curated.jsonl"
V2_TRAIN = ROOT / "cases" / "v2" / "train_procedural.jsonl"
CASES = read_cases(V2_EVAL)
REPORTED = ["oracle", "careful-v2", "careful", "naive", "refuse-all"]
CLASSIC_SHORTCUTS = ["profile-only", "careful-sql"]  # the classic agents that judge from less, on v2 cases


@pytest.fixture(scope="module")
def grades():
    results = play_cases(CASES, [*REPORTED, *V2_ATTACKERS, *SHORTCUTS, *CLASSIC_SHORTCUTS, "random"])
    return {name: [r.grade for r in rs] for name, rs in results.items()}


@pytest.fixture(scope="module")
def train_grades():
    results = play_cases(read_cases(V2_TRAIN), ["oracle", "careful-v2", "careful", *V2_ATTACKERS, *SHORTCUTS,
                                                "profile-only"], workers=2)
    return {name: [r.grade for r in rs] for name, rs in results.items()}


def figure(g, key):
    """A grade's figure: a term or field, or one of suite v2's metrics (`g.metrics`)."""
    return g.metrics[key] if key in g.metrics else getattr(g, key)


def mean(gs, key="reward"):
    return float(exact_mean(figure(g, key) for g in gs))


def test_oracle_and_careful_v2_score_1_on_every_case(grades):
    for name in ("oracle", "careful-v2"):
        assert [g.reward for g in grades[name]] == [1.0] * len(CASES), name
        assert sum(g.metrics["bad_rows_loaded"] for g in grades[name]) == 0
        assert sum(g.metrics["clean_rows_lost"] for g in grades[name]) == 0


def per_family(gs) -> dict[str, float]:
    return {f: mean([g for g in gs if g.family == f]) for f in FAMILIES}


def test_the_classic_careful_agent_is_not_enough_for_any_new_family(grades):
    families = per_family(grades["careful"])
    assert max(families.values()) <= 0.8, families
    assert min(families.values()) < 0.5  # and some families much worse than that


def test_a_crash_is_a_failed_episode_with_its_reason_counted_apart(grades):
    """The classic careful names the contract's columns in its queries: a file whose amount column was
    renamed makes it raise. That episode fails (graded 0, its reason kept), and the tables say so."""
    from gate_pipeline.tables import baseline_tables
    failed = [g for g in grades["careful"] if g.failed]
    assert [g.case_id for g in failed] == ["v2-eval-schema-drift-1", "v2-eval-schema-drift-1-b"]
    assert {g.reason for g in failed} == {"RuntimeError: careful: query failed: no such column: amount"}
    assert failed[0].reward == 0.0 and not any(g.failed for name in ("oracle", "careful-v2") for g in grades[name])
    text = baseline_tables(CASES, {"careful": grades["careful"], "oracle": grades["oracle"]})
    assert "failed episodes                 2/64          0/64" in text
    assert "  careful: 2 of 64 (schema-drift 2): RuntimeError: careful: query failed: no such column: amount" in text


def test_the_printed_report_figures(grades):
    """docs/suite-v2.md and the README print these (gate report --cases cases/v2/eval_curated.jsonl)."""
    assert [f"{mean(grades[a]):.4f}" for a in REPORTED] == ["1.0000", "1.0000", "0.5354", "0.3907", "0.5105"]


@pytest.mark.parametrize("attacker", V2_ATTACKERS)
def test_every_v2_attacker_stays_at_least_005_below_careful_v2(grades, attacker):
    assert mean(grades[attacker]) <= mean(grades["careful-v2"]) - 0.05


@pytest.mark.parametrize("shortcut", [*SHORTCUTS, *CLASSIC_SHORTCUTS])
def test_every_shortcut_stays_at_least_010_below_careful_v2_and_at_most_085(grades, shortcut):
    assert mean(grades[shortcut]) <= min(0.85, mean(grades["careful-v2"]) - 0.10), mean(grades[shortcut])


@pytest.mark.slow
def test_on_train_oracle_and_careful_v2_score_1_and_every_shortcut_and_attacker_stays_below(train_grades):
    for name in ("oracle", "careful-v2"):
        assert all(g.reward == 1.0 for g in train_grades[name]), name
    top = mean(train_grades["careful-v2"])
    for name in V2_ATTACKERS:
        assert mean(train_grades[name]) <= top - 0.05, name
    for name in [*SHORTCUTS, "profile-only"]:
        assert mean(train_grades[name]) <= min(0.85, top - 0.10), (name, mean(train_grades[name]))
    families = per_family(train_grades["careful"])
    assert max(families.values()) <= 0.8, families


def test_each_attacker_loses_where_it_was_built_to(grades):
    def m(name, key):
        return mean(grades[name], key)
    assert m("ask-everything", "question_cost") > 0 and m("ask-everything", "disposition") == 1.0
    assert m("cite-everything", "evidence") < 0.5 and m("cite-everything", "disposition") == 1.0
    assert m("where-zero", "inspected") == 0.0 and m("where-zero", "disposition") == 1.0
    assert sum(g.metrics["clean_rows_lost"] for g in grades["row-spray"]) > 0
    assert m("quarantine-all-rows", "disposition") < 0.3 and m("quarantine-all-rows", "clean_rows_lost") > 0
    obeyed = [g for g in grades["obey-data"] if g.reward < 1.0]
    assert {g.family for g in obeyed} >= {"instruction-in-data"} and len(obeyed) >= 4
    lost = {name: {g.family for g in grades[name] if g.reward < 1.0} for name in SHORTCUTS}
    assert {"unit-shift", "volume-anomaly", "late-dimension"} <= lost["no-warehouse"]
    assert {"unit-shift", "volume-anomaly"} <= lost["no-history"] and "schema-drift" not in lost["no-history"]
    assert "partial-defect" in lost["profiles-only"] and m("by-table", "inspected") == 0.0


def test_careful_v2_reads_no_label():
    """Flip every label: an agent that sees only what the tools return plays the same calls."""
    for case in CASES[::3]:
        flipped = copy.deepcopy(case.data)
        for b in flipped["batches"]:
            b["truth"] = {"defective": False, "disposition": "load", "defects": []}
        flipped["owner"] = [dict(r) for r in case.data["owner"]]  # the owner's rulings are what it may ask for
        a, b = (play(prepare(c), "careful-v2").ledger for c in (case, load_case(flipped)))
        strip = [(e["action"], e["args"], e["executed"]) for e in a]
        assert strip == [(e["action"], e["args"], e["executed"]) for e in b], case.case_id


def test_careful_v2_scores_1_on_the_classic_eval_split_too(eval_cases):
    results = play_cases(eval_cases, ["careful-v2", "oracle"])
    for name, rs in results.items():
        assert [r.grade.reward for r in rs] == [1.0] * len(eval_cases), name


def test_gate_report_and_attacks_default_to_suite_v2s_agents(capsys):
    assert main(["report", "--cases", str(V2_EVAL)]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[2].split()
    assert head == ["naive", "careful", "careful-v2", "refuse-all"]
    assert "bad rows loaded" in out and "question cost (mean)" in out and "ask-the-owner" in out
    assert main(["attacks", "--cases", str(V2_EVAL), "--agents", "careful-v2,where-zero"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("careful-v2 (target)") and "q cost" in out.splitlines()[0]


# -- one engine, every surface -------------------------------------------------------------------

SURFACE_AGENTS = ["careful-v2", "oracle", "naive", "random", "obey-data", "ask-everything"]
SURFACE_CASES = CASES[::4]  # one case of each family


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    import contextlib
    import io

    from gate_pipeline.kernel.cases import write_cases
    buf = io.StringIO()
    path = write_cases(tmp_path_factory.mktemp("v2") / "surface_cases.jsonl", SURFACE_CASES)
    with contextlib.redirect_stdout(buf):
        assert main(["report", "--cases", str(path), "--agents", ",".join(SURFACE_AGENTS), "--json"]) == 0
    return json.loads(buf.getvalue())["agents"]


def test_the_gym_env_and_a_replay_of_its_calls_grade_as_gate_report_does(reported, tmp_path, capsys):
    from gate_pipeline.integrations.gymnasium_env import GateEnv
    env = GateEnv(SURFACE_CASES, max_turns=100_000)
    lines = []
    for agent_name in SURFACE_AGENTS:
        for k, case in enumerate(SURFACE_CASES):
            agent = make_agent(agent_name)
            _, info = env.reset(options={"case_id": case.case_id})
            assert list(json.loads(info["tools"])) == ["read_contract", "list_batches", "profile_batch", "run_sql", "load_batch",
                                           "quarantine_batch", "quarantine_rows", "cite_defect", "ask_owner",
                                           "submit_report"]
            sent, last = [], {}

            class Tools:
                episode_seed = env.session.episode_seed
                tool_names = tuple(json.loads(info["tools"]))
                suite = suites.get("v2")

                def __call__(self, name, **args):
                    return self.act({"tool": name, "args": args})

                def act(self, action, sent=sent, last=last):
                    text = json.dumps(action)
                    sent.append(text)
                    _, _, _, _, step_info = env.step(text)
                    last.update(step_info)
                    return json.loads(step_info["result"])
            agent.play(Tools(), case.data if agent.oracle else None)
            assert json.loads(last["grade"]) == reported[agent_name][k], (agent_name, case.case_id)
            lines.append({"case_id": case.case_id, "calls": sent})
    trajectories = tmp_path / "calls.jsonl"
    trajectories.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["replay", "--cases", str(V2_EVAL), "--trajectories", str(trajectories), "--json"]) == 0
    replayed = [json.loads(line)["grade"] for line in capsys.readouterr().out.splitlines()]
    assert replayed == [reported[a][k] for a in SURFACE_AGENTS for k in range(len(SURFACE_CASES))]


def test_a_dagster_case_run_of_a_v2_partition_grades_as_gate_report_does(reported, tmp_path, monkeypatch):
    from gate_pipeline.dagster_defs.definitions import defs
    from gate_pipeline.dagster_defs.jobs import play_case_run_config
    from gate_pipeline.dagster_defs.partitions import case_index, cases_partitions
    from gate_pipeline.kernel.grading import grade_stored
    from gate_pipeline.store import RunStore
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.setenv("GATE_CASES_DIR", str(ROOT / "cases"))
    refs = case_index(ROOT / "cases").refs
    assert refs[SURFACE_CASES[0].case_id].suite == "v2" and refs["eval-clean-control-0"].suite == "classic"
    store = RunStore()
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(cases_partitions.name, [c.case_id for c in SURFACE_CASES])
        for k, case in enumerate(SURFACE_CASES[:3]):
            agent = SURFACE_AGENTS[k]
            run = defs.resolve_job_def("play_case").execute_in_process(
                instance=instance, partition_key=case.case_id, run_config=play_case_run_config(agent))
            assert run.success
            checks = [e for e in run.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
            assert len(checks) == 1  # the one contract check: the v2 contract's schemas on every batch
            evaluation = checks[0].event_specific_data
            assert evaluation.metadata["batches_checked"].value == len(case.batches)
            assert evaluation.passed == (evaluation.metadata["batches_failing"].value == 0)
            episode = store.episodes(run_id=run.run_id)[0]
            assert grade_stored(store.load(episode["episode_id"])).as_dict() == reported[agent][k]


# -- a shortcut that learns priors from train's labels ----------------------------------------------------



class ShapeGuesser(LoadLogOnly):
    """load-log-only, plus what a model trained on train's labels could learn: for each shape of the night
    (what load-log-only finds in either batch), the warehouse-only defect a batch most often hides there;
    where `rules` names one, the batch is quarantined whole citing it (an outside review's attack)."""
    name = "shape-guesser"
    rules: dict = {}
    seen: list = []

    def prepare(self, tools, listing, contract):
        super().prepare(tools, listing, contract)
        shapes = {}
        for b in self.order(listing):  # judged ahead, to know the night before acting on either batch
            verdict, citations, _ = LoadLogOnly.judge(self, tools, b, contract)
            shapes[b["table"]] = (verdict, tuple(sorted({t for _, t in citations})))
        super().prepare(tools, listing, contract)
        self.night = (shapes.get("customers"), shapes.get("orders"))
        ShapeGuesser.seen.append(self.night)

    def judge(self, tools, batch, contract):
        verdict, citations, rows = super().judge(tools, batch, contract)
        guess = self.rules.get((self.night, batch["table"]))
        if not guess or verdict == "quarantine":
            return verdict, citations, rows
        if batch["table"] == "customers":  # quarantined whole: tonight's orders of any of them are orphans
            self.gone |= {str(k) for k in fetch_values_or_none(
                tools, f"SELECT customer_id FROM {batch['staging_table']}") or []}
        return "quarantine", list(dict.fromkeys([*citations, tuple(guess)])), []


WAREHOUSE_ONLY = {"duplicate_key", "duplicate_content", "orphan_reference"}


def learned_rules(cases, nights, share: float) -> dict:
    counts: dict = {}
    for case, night in zip(cases, nights):
        for b in case.batches:
            hidden = next(((d["column"], d["type"]) for d in b.truth["defects"] if d["type"] in WAREHOUSE_ONLY), None)
            counts.setdefault((night, b.table), []).append(hidden)
    rules = {}
    for key, found in counts.items():
        named = [h for h in found if h]
        if named:
            best = max(set(named), key=named.count)
            if named.count(best) / len(found) > share:
                rules[key] = best
    return rules


@pytest.mark.slow
def test_priors_learned_from_trains_labels_do_not_lift_a_shortcut_above_its_bound(train_grades, grades):
    """A shortcut that never reads wh_customers or wh_orders, taught by train's labels which nights hide what
    (in the sample it learned from, and on eval), stays within the shortcuts' bound."""
    train = read_cases(V2_TRAIN)
    spec = AgentSpec(ShapeGuesser.name, {}, ShapeGuesser, identity=ShapeGuesser.name)
    ShapeGuesser.rules, ShapeGuesser.seen = {}, []
    play_cases(train, [spec], workers=1)
    nights = list(ShapeGuesser.seen)
    for share in (0.5, 0.7, 0.9):
        ShapeGuesser.rules = learned_rules(train, nights, share)
        assert ShapeGuesser.rules, share
        for cases, top in ((train, mean(train_grades["careful-v2"])), (CASES, mean(grades["careful-v2"]))):
            scored = mean([r.grade for r in play_cases(cases, [spec], workers=1)[ShapeGuesser.name]])
            assert scored <= min(0.85, top - 0.10), (share, len(cases), scored)
    ShapeGuesser.rules = {}


@pytest.mark.parametrize("split", ["eval", pytest.param("train", marks=pytest.mark.slow)])
def test_a_fourth_reviews_shape_guesses_stay_within_the_shortcuts_bound(split, grades):
    """`v2_shape_hold.ShapeHold` (every row held back where a batch's signature hides one, the pair of
    orders of a missing customer, a quiet night held back whole, re-sent orders beside short customers)."""
    from v2_shape_hold import ShapeHold
    spec = AgentSpec(ShapeHold.name, {}, ShapeHold, identity=ShapeHold.name)
    cases = CASES if split == "eval" else read_cases(V2_TRAIN)
    scored = mean([r.grade for r in play_cases(cases, [spec], workers=2)[ShapeHold.name]])
    assert scored <= min(0.85, mean(grades["careful-v2"]) - 0.10), scored


def test_careful_v2s_frame_of_column_chunks_holds_its_rows_and_is_judged_as_they_are():
    """careful-v2 keeps a batch's values by column, in chunks (text as pandas' string dtype, anything else as it
    is): the frame built from them holds the values its rows give (duplicate column names, no rows, NULLs and
    text alike), and the contract's checks find on it exactly what they find on the frame of the rows."""
    import random

    import pandas as pd

    from gate_pipeline.kernel.contract import load_contract
    from gate_pipeline.suites.v2.contract import COLUMNS_V2
    from gate_pipeline.suites.v2.schemas import column_chunk, findings, frame_of

    def chunked(column: list, draw: random.Random) -> list:
        out, at = [], 0
        while at < len(column):
            step = draw.choice([1, 2, 5, 50])
            out.append(column_chunk(column[at:at + step]))
            at += step
        return out

    draw = random.Random(3)
    for columns in (["a", "b", "c"], ["a", "a", "b"], ["x"], ["order_id", "customer_id", "amount", "note"]):
        for n in (0, 1, 7, 120):
            rows = [tuple(draw.choice(["", "1", " x ", None, "é", "2.50", "a,b"]) for _ in columns) for _ in range(n)]
            by_columns = frame_of(columns, [chunked(list(c), draw) for c in zip(*rows)] if rows else [[] for _ in columns], n)
            assert list(by_columns.columns) == columns and by_columns.index.equals(pd.RangeIndex(n))
            assert [tuple(None if v is None else v for v in r) for r in by_columns.itertuples(index=False)] == rows
    contract = load_contract("v2")
    pools = {"customers": {"customer_id": ["C1", "C2", "C3", "C1", " "], "email": ["a@b.co", "", "no-at", " x@y.z", "é@x.io"],
                           "country": ["US", "DE", "Deutschland", "", "us"], "signup_date": ["2026-01-01", "2027-12-31", "x"]},
             "orders": {"order_id": ["O1", "O2", "O1", "O3"], "customer_id": ["C1", "C9", ""],
                        "amount": ["12.50", "", "  ", "1,5", "-3.00", "60000", "0", "7"], "currency": ["USD", "EUR", ""],
                        "status": ["placed", "refunded", "lost", ""], "order_date": ["2026-10-01", "2026-12-31", "2020-01-01"],
                        "note": ["", "gift, please", "é"]}}
    keys = {"existing_keys": {"C2", "O3"}, "missing_customers": {"C9"}}
    for table, pool in pools.items():
        header = list(COLUMNS_V2[table])
        for n in (0, 3, 40, 200):
            rows = [tuple(draw.choice(pool[c]) for c in header) for _ in range(n)]
            chunks = [chunked(list(c), draw) for c in zip(*rows)] if rows else [[] for _ in header]
            as_rows = pd.DataFrame(rows, columns=header, dtype=object) if rows else \
                pd.DataFrame({c: pd.Series([], dtype=object) for c in header})
            for accepted in ({}, {"country": {"Deutschland"}, "currency": {"EUR"}}):
                found = [findings(contract, table, header, df, keys, None, (), accepted).failures
                         for df in (frame_of(header, chunks, n), as_rows)]
                assert found[0] == found[1], (table, n)


def test_the_checks_strings_go_to_the_system_allocator_unless_told_otherwise():
    """pyarrow's default pool keeps what careful-v2's checks free; loading the v2 schemas first makes it the
    system allocator, and ARROW_DEFAULT_MEMORY_POOL, when set, is left as it says."""
    import os
    import subprocess
    import sys
    probe = ("import gate_pipeline.suites.v2.schemas, pyarrow, pandas as pd; pd.Series(['a']).astype(str); "
             "print(pyarrow.default_memory_pool().backend_name)")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    for told, expected in ((None, "system"), ("mimalloc", "mimalloc")):
        run_env = env if told is None else {**env, "ARROW_DEFAULT_MEMORY_POOL": told}
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run_env, cwd=ROOT,
                             timeout=120, check=True)
        assert out.stdout.split()[-1] == expected, out


@pytest.mark.parametrize("rows", [0, 49, 50, 100, 499, 500, 550, 1000, 1001])
def test_careful_v2_reads_every_row_of_a_batch_whatever_its_length(rows):
    """A batch of a multiple of 50 rows ends with a full page, then an empty one: the rows read before it are
    kept all the same (they once were not, and the frame was padded with missing values)."""
    import sqlite3

    from gate_pipeline.suites.v2.agents import fetch_rows
    from gate_pipeline.suites.v2.schemas import frame_of
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE stg (order_id TEXT, amount TEXT)")
    conn.executemany("INSERT INTO stg VALUES (?, ?)", [(f"O-{k}", f"{k}.50") for k in range(rows)])

    def tools(tool, query):
        cur = conn.execute(query)
        return {"columns": [d[0] for d in cur.description], "rows": [list(r) for r in cur.fetchall()]}

    columns, chunks, count = fetch_rows(tools, "stg")
    df = frame_of(columns, chunks, count)
    assert count == rows and list(df.columns) == ["order_id", "amount"]
    assert df["order_id"].tolist() == [f"O-{k}" for k in range(rows)] and not df.isna().any().any()
    with pytest.raises(ValueError, match="do not hold"):  # a column read short is an error, never padded
        frame_of(columns, chunks, count + 1)


def test_careful_v2_scores_1_on_cases_whose_batches_hold_multiples_of_50_rows(tmp_path):
    assert main(["cases", "generate", "--suite", "v2", "--rows", "100", "--split", "eval", "--out",
                 str(tmp_path)]) == 0
    cases = read_cases(tmp_path / "eval_curated.jsonl")
    assert any(b["row_count"] % 50 == 0 for c in cases for b in c.data["batches"])
    results = play_cases(cases, ["careful-v2"])["careful-v2"]
    assert [r.grade.reward for r in results] == [1.0] * len(cases)
