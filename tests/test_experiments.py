"""Contract-schema experiments on the committed eval cases: which rule stops which family."""
import json
from pathlib import Path

import pytest

from gate_pipeline.cli.main import main
from gate_pipeline.experiments import experiment_tables, run_experiment
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.variants import load_variants

CASES = Path(__file__).resolve().parent.parent / "cases" / "classic" / "eval_curated.jsonl"
VARIANTS = ["full", "no-orders.customer_id.orphan_reference", "no-orders.amount.out_of_range",
            "profile-visible", "over-strict"]


@pytest.fixture(scope="module")
def experiment():
    return run_experiment(read_cases(CASES), load_variants(VARIANTS))


def test_full_contract_stops_every_bad_batch_and_refuses_nothing_clean(experiment):
    s = experiment[0]
    full = s["variants"]["full"]
    assert (s["cases"], s["defective"], s["clean"]) == (32, 24, 40)
    assert full["reward"] == 1.0
    assert full["bad_batches_loaded"] == 0 and full["clean_batches_refused"] == 0
    assert full["revenue_error_usd"] == 0.0 and full["let_through"] == []


def test_dropping_one_rule_lets_exactly_its_family_through(experiment):
    V = experiment[0]["variants"]
    orphan = V["no-orders.customer_id.orphan_reference"]
    assert orphan["let_through"] == ["orphan-customer"]
    assert orphan["bad_batches_loaded"] > 0 and orphan["clean_batches_refused"] == 0
    assert orphan["per_family"]["orphan-customer"]["reward"] < 1.0
    assert all(f["reward"] == 1.0 for fam, f in orphan["per_family"].items() if fam != "orphan-customer")
    cap = V["no-orders.amount.out_of_range"]
    assert cap["let_through"] == ["amount-bounds"]
    # the cents/dollars mix-ups: the largest revenue error of any single-rule ablation here
    assert cap["revenue_error_usd"] > orphan["revenue_error_usd"]


def test_profile_visible_rules_miss_what_only_the_warehouse_shows(experiment):
    pv = experiment[0]["variants"]["profile-visible"]
    assert pv["let_through"] == ["resent-rows", "orphan-customer", "dimension-fanout"]
    assert pv["clean_batches_refused"] == 0


def test_over_strict_refuses_clean_batches_and_loses_revenue(experiment):
    s, grades = experiment
    strict = s["variants"]["over-strict"]
    assert strict["bad_batches_loaded"] == 0
    assert strict["clean_batches_refused"] > 0 and strict["revenue_error_usd"] > 0
    assert strict["reward"] < 1.0
    assert strict["clean_batches_refused"] == sum(g.clean_batches_refused for g in grades["careful@over-strict"])
    assert strict["refused_clean_in"]  # names where the good data was refused
    assert "legit-edge" in strict["refused_clean_in"]  # an amount at the 50,000 cap, a date on the 30th


def test_table_has_one_row_per_variant(experiment):
    text = experiment_tables(experiment[0])
    rows = [line.split()[0] for line in text.splitlines()[3:3 + len(VARIANTS)]]
    assert rows == VARIANTS
    assert "orphan-customer" in text.splitlines()[3 + VARIANTS.index("no-orders.customer_id.orphan_reference")]


def test_cli_experiment_json_agrees_with_report_of_the_variant_agent(capsys):
    assert main(["experiment", "--cases", str(CASES), "--variants", "over-strict", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["experiment"]["variants"]) == ["over-strict"]
    assert main(["report", "--cases", str(CASES), "--agents", "careful@over-strict", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["agents"]["careful@over-strict"]
    via_experiment = out["agents"]["careful@over-strict"]
    keys = ["case_id", "reward", "bad_batches_loaded", "revenue_error_usd", "ledger_intact"]
    assert [{k: g[k] for k in keys} for g in via_experiment] == [{k: g[k] for k in keys} for g in report]


@pytest.mark.parametrize("argv, needle", [
    (["experiment", "--variants", "nope"], "unknown variant 'nope'"),
    (["experiment", "--variants", " , "], "--variants needs at least one"),
    (["experiment", "--cases", "/no/such.jsonl"], "/no/such.jsonl"),
    (["experiment", "--html", "/no/such/dir/x.html"], "folder /no/such/dir does not exist"),
    (["report", "--agents", "careful@nope"], "unknown variant 'nope'"),
    (["report", "--agents", "naive@full"], "only careful, careful-v2 take a contract variant"),
])
def test_cli_errors_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("gate: error: ") and err.count("\n") == 1


def test_by_default_every_variant_file_of_the_contracts_directory_is_played(tmp_path):
    contracts = tmp_path / "contracts"
    (contracts / "variants").mkdir(parents=True)
    root = Path(__file__).resolve().parent.parent
    (contracts / "classic.yaml").write_text((root / "contracts" / "classic.yaml").read_text(encoding="utf-8"),
                                            encoding="utf-8")
    (contracts / "variants" / "cap-20k.yaml").write_text(
        "variant:\n  base: classic\n  description: cap 20k\n  overrides: {limits: {max_amount: 20000}}\n",
        encoding="utf-8")
    cases = read_cases(CASES)[:4]
    ticks = []
    summary, grades = run_experiment(cases, progress=lambda: ticks.append(1), contracts=contracts)
    assert list(summary["variants"]) == ["cap-20k"] and list(grades) == ["careful@cap-20k"]
    assert [g.case_id for g in grades["careful@cap-20k"]] == [c.case_id for c in cases]
    assert summary["variants"]["cap-20k"]["description"] == "cap 20k" and len(ticks) == len(cases)


NIGHTLY_VARIANTS = ["full", "no-orders.customer_id.orphan_reference", "over-strict"]


@pytest.fixture
def gate_home(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_HOME", str(tmp_path / "gate"))
    monkeypatch.delenv("GATE_DB_URL", raising=False)
    return tmp_path


def test_variants_run_as_a_config_of_the_nightly_benchmark_job(gate_home):
    """careful@<variant> names are agents of the Dagster benchmark job; its stored-run scoreboard
    agrees case by case with the in-process experiment."""
    import dagster as dg

    from gate_pipeline.dagster_defs.definitions import defs
    from gate_pipeline.dagster_defs.jobs import nightly_run_config
    from gate_pipeline.kernel.cases import write_cases

    cases = [c for c in read_cases(CASES) if c.family in ("orphan-customer", "legit-edge")]
    small = gate_home / "eval_orphan_legit.jsonl"
    write_cases(small, cases)
    agents = [f"careful@{v}" for v in NIGHTLY_VARIANTS]
    with dg.DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("nightly_benchmark").execute_in_process(
            instance=instance, run_config=nightly_run_config(str(small), agents, chunk_size=4))
        board = result.output_for_node("scoreboard")
    _, expected = run_experiment(cases, load_variants(NIGHTLY_VARIANTS))
    keys = ["case_id", "family", "reward", "disposition", "evidence", "bad_batches_loaded",
            "revenue_error_usd", "ledger_intact"]
    assert list(board["grades"]) == agents
    for agent in agents:
        assert [{k: g[k] for k in keys} for g in board["grades"][agent]] == \
               [{k: getattr(g, k) for k in keys} for g in expected[agent]]
    A = board["summary"]["agents"]
    assert A["careful@full"]["reward"] == 1.0
    assert A["careful@no-orders.customer_id.orphan_reference"]["bad_batches_loaded"] > 0
    assert A["careful@over-strict"]["reward"] < 1.0


def test_nightly_job_refuses_an_unknown_variant(gate_home):
    import dagster as dg

    from gate_pipeline.dagster_defs.definitions import defs
    from gate_pipeline.dagster_defs.jobs import nightly_run_config
    with dg.DagsterInstance.ephemeral() as instance:  # not one the code location lists: refused at launch
        with pytest.raises(dg.DagsterInvalidConfigError, match="not in enum type AgentName got careful@no-such-variant"):
            defs.resolve_job_def("nightly_benchmark").execute_in_process(
                instance=instance, raise_on_error=False,
                run_config=nightly_run_config(str(CASES), ["careful@no-such-variant"]))
        assert instance.get_runs() == []
