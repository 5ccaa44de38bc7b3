"""Contract-schema variants: the built-in files, the variant agent, and refusals of broken files."""
from pathlib import Path

import pytest

from gate_pipeline.kernel.agents import UnknownAgent, make_agent, resolve_agent
from gate_pipeline.kernel.contract import ContractError, load_contract
from gate_pipeline.kernel.variants import load_variant, load_variant_file, load_variants, variant_names
from gate_pipeline.suites.classic.agents import CarefulPandera
from gate_pipeline.suites.classic.rules import CATALOGUE

RULES = [r.key for r in CATALOGUE]


def test_built_in_variants_cover_every_rule_once():
    names = variant_names()
    assert names[0] == "full"
    ablation = [n for n in names if n.startswith("no-")]
    assert ablation == [f"no-{k}" for k in RULES]  # one per rule, in catalogue order
    for name in ablation:
        assert load_variant(name).remove_rules == (name[3:],)
    assert {"profile-visible", "over-strict"} <= set(names)


def test_profile_visible_removes_exactly_the_warehouse_rules():
    v = load_variant("profile-visible")
    assert set(v.remove_rules) == {r.key for r in CATALOGUE if r.needs_warehouse}


def test_over_strict_overrides_only_what_it_says():
    base = load_contract("classic")
    strict = load_variant("over-strict").apply(base)
    assert strict["limits"]["max_amount"] == 10000
    assert strict["reporting_window"] == {"start": "2026-09-01", "end": "2026-09-29"}
    assert strict["limits"]["allowed_status"] == base["limits"]["allowed_status"]
    assert base["limits"]["max_amount"] == 50000  # the contract read is not mutated


def test_variant_agent_is_careful_with_the_variant_applied():
    agent = make_agent("careful@no-orders.customer_id.orphan_reference")
    assert isinstance(agent, CarefulPandera)
    assert agent.name == "careful@no-orders.customer_id.orphan_reference"
    assert agent.without == ("orders.customer_id.orphan_reference",)
    strict = make_agent("careful@over-strict")
    assert strict.contract_view(load_contract("classic"))["limits"]["max_amount"] == 10000


@pytest.mark.parametrize("name, needle", [
    ("careful@no-such-variant", "unknown variant 'no-such-variant'"),
    ("naive@full", "only careful, careful-v2 take a contract variant"),
    ("careful@", "unknown variant ''"),
    ("careful@../classic", "unknown variant '../classic'"),
])
def test_unknown_variant_agents_are_one_clear_error(name, needle):
    with pytest.raises(UnknownAgent, match=None) as exc:
        make_agent(name)
    assert needle in str(exc.value)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "contracts" / "variants" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def user_contracts(tmp_path):
    """A contracts/ dir of the user's own: the classic contract plus variant files written by a test.
    Library functions are given it explicitly (`contracts=`); only the CLI reads GATE_CONTRACTS."""
    (tmp_path / "contracts").mkdir()
    classic = Path(__file__).resolve().parent.parent / "contracts" / "classic.yaml"
    (tmp_path / "contracts" / "classic.yaml").write_text(classic.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def _contracts(user_contracts: Path) -> Path:
    return user_contracts / "contracts"


def _agent(name: str, user_contracts: Path):
    """The agent `name` as the engine builds it with the user's contracts directory."""
    return resolve_agent(name, contracts=_contracts(user_contracts)).build()


GOOD = "variant:\n  base: classic\n  description: cap 20k\n  overrides: {limits: {max_amount: 20000}}\n"


def test_a_user_adds_a_variant_by_writing_a_file(user_contracts):
    _write(user_contracts, "cap-20k", GOOD)
    assert variant_names(_contracts(user_contracts)) == ["cap-20k"]
    agent = _agent("careful@cap-20k", user_contracts)
    assert agent.name == "careful@cap-20k"
    assert agent.contract_view(load_contract("classic"))["limits"]["max_amount"] == 20000


def test_library_functions_read_no_environment_variable(user_contracts, monkeypatch):
    """The core takes explicit paths: GATE_CONTRACTS reaches it only through the CLI's settings."""
    _write(user_contracts, "cap-20k", GOOD)
    shipped = variant_names()
    monkeypatch.setenv("GATE_CONTRACTS", str(_contracts(user_contracts)))
    assert variant_names() == shipped and "cap-20k" not in shipped and "full" in shipped
    with pytest.raises(UnknownAgent, match="unknown variant 'cap-20k'"):
        make_agent("careful@cap-20k")
    from gate_pipeline.kernel.settings import Settings
    assert variant_names(Settings.from_env().contracts_dir) == ["cap-20k"]


@pytest.mark.parametrize("text, key", [
    ("variant:\n  base: classic\n  description: x\n  remove_rule: [orders.amount.out_of_range]\n", "'variant.remove_rule'"),
    ("variant:\n  base: classic\n  description: x\n  remove_rules: [orders.amount.too_big]\n", "'variant.remove_rules'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {limits: {max_amont: 5}}\n", "'variant.overrides.limits.max_amont'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {limits: {max_amount: '5'}}\n", "'variant.overrides.limits.max_amount'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {limits: {max_amount: -5}}\n", "'variant.overrides.limits.max_amount'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {orders: {amount: free}}\n", "'variant.overrides.orders'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {reporting_window: {end: 'Sept 29'}}\n",
     "'variant.overrides.reporting_window.end'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {reporting_window: {start: '2026-10-01'}}\n",
     "'variant.overrides.reporting_window'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {limits: {allowed_status: [1, 2]}}\n",
     "'variant.overrides.limits.allowed_status'"),
    ("variant:\n  base: classic\n  description: x\n  overrides: {limits: {allowed_countries: []}}\n",
     "'variant.overrides.limits.allowed_countries'"),
    ("variant:\n  base: nope\n  description: x\n", "'variant.base'"),
    ("variant:\n  description: x\n", "'variant.base'"),
    ("variant:\n  base: classic\n", "'variant.description'"),
    ("variant: [1, 2]\n", "'variant'"),
    ("base: classic\n", "'variant'"),
    ("variant:\n  base: classic\n  description: x\nextra: 1\n", "'extra'"),
    ("variant: {base: classic, description: [\n", "not valid YAML"),
])
def test_a_broken_variant_file_names_the_file_and_the_key(user_contracts, text, key):
    path = _write(user_contracts, "mine", text)
    with pytest.raises(ContractError) as exc:
        load_variant_file(path, _contracts(user_contracts))
    message = str(exc.value)
    assert str(path) in message and key in message
    assert "\n" not in message
    # the same error reaches whoever loads every variant, and the variant agent
    with pytest.raises(ContractError, match="mine.yaml"):
        load_variants(None, _contracts(user_contracts))
    with pytest.raises(UnknownAgent, match="mine.yaml"):
        _agent("careful@mine", user_contracts)


def test_gate_experiment_reports_a_broken_variant_file_in_one_line(user_contracts, capsys, monkeypatch):
    from gate_pipeline.cli.main import main
    monkeypatch.setenv("GATE_CONTRACTS", str(_contracts(user_contracts)))
    _write(user_contracts, "mine", "variant:\n  base: classic\n  description: x\n  overides: {}\n")
    cases = Path(__file__).resolve().parent.parent / "cases" / "classic" / "eval_curated.jsonl"
    assert main(["experiment", "--cases", str(cases)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gate: error: ") and "mine.yaml" in err and "'variant.overides'" in err
    assert len(err.splitlines()) == 1


def test_a_badly_named_variant_file_is_named_in_the_error(user_contracts):
    _write(user_contracts, "Cap 20k", GOOD)
    with pytest.raises(ContractError) as exc:
        load_variants(None, _contracts(user_contracts))
    assert "Cap 20k.yaml" in str(exc.value) and "must be lower-case" in str(exc.value)


@pytest.mark.parametrize("override, key", [("{limits: {max_amount: .nan}}", "variant.overrides.limits.max_amount"),
                                           ("{limits: {currency: ''}}", "variant.overrides.limits.currency"),
                                           ("{reporting_window: {end: '2026-13-45'}}", "variant.overrides.reporting_window.end")])
def test_impossible_override_values_are_refused(user_contracts, override, key):
    path = _write(user_contracts, "odd", f"variant:\n  base: classic\n  description: x\n  overrides: {override}\n")
    with pytest.raises(ContractError, match=key.replace(".", r"\.")):
        load_variant_file(path, _contracts(user_contracts))


@pytest.mark.parametrize("base", ["a\x00b", "/work/contracts/classic", "../x/classic", ".hidden", ""])
def test_a_variant_base_must_name_a_contract_in_the_contracts_folder(tmp_path, base):
    """A NUL in it was a ValueError out of the open (a traceback); a path read a contract from outside the
    contracts folder."""
    import shutil

    from gate_pipeline.kernel.contract import SHIPPED_CONTRACTS
    contracts = tmp_path / "contracts"
    shutil.copytree(SHIPPED_CONTRACTS, contracts)
    f = contracts / "variants" / "x.yaml"
    f.write_text(f'variant:\n  base: "{base.encode("unicode_escape").decode()}"\n  description: d\n')
    with pytest.raises(ContractError, match="variant.base"):
        load_variant_file(f, contracts)
    f.write_text('variant:\n  base: classic\n  description: d\n  overrides:\n    reporting_window: {start: "2027-01-01"}\n')
    with pytest.raises(ContractError, match=r"key 'variant.overrides.reporting_window' starts after it ends"):
        load_variant_file(f, contracts)
