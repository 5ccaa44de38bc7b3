"""The contract document: loaded and validated from YAML, identical to what read_contract
returns, and the source the pandera schemas are built from (not written twice)."""
from __future__ import annotations

import pytest
import yaml
from conftest import ROOT

from gate_pipeline.kernel import contract as contract_module
from gate_pipeline.kernel.contract import ContractError, load_contract, load_contract_file
from gate_pipeline.kernel.engine import prepare
from gate_pipeline.suites.classic.contract import DEFECT_TYPES
from gate_pipeline.suites.classic.schemas import CATALOGUE, build_schema, failing_rules, frame, rules_for


def test_read_contract_returns_the_yaml_document(eval_cases):
    doc = load_contract("classic")
    for case in eval_cases[:3]:
        prepared = prepare(case)
        ep = prepared.suite.episode(prepared)
        assert ep.call("read_contract") == doc
        ep.close()
    assert doc["limits"]["max_amount"] == 50000 and isinstance(doc["limits"]["max_amount"], int)
    assert doc["defect_types"] == list(DEFECT_TYPES)


def _write(tmp_path, doc):
    p = tmp_path / "broken.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("path", ["limits.max_amount", "reporting_window.end", "defect_types", "orders", "limits"])
def test_a_contract_missing_a_key_names_file_and_key(tmp_path, path):
    doc = load_contract("classic")
    node = doc
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    del node[last]
    with pytest.raises(ContractError, match=rf"broken\.yaml: missing key '{path}"):
        load_contract_file(_write(tmp_path, doc))


def test_a_contract_with_wrong_types_or_unknown_columns_is_refused(tmp_path):
    doc = load_contract("classic")
    doc["limits"]["max_amount"] = "lots"
    with pytest.raises(ContractError, match=r"broken\.yaml: key 'limits\.max_amount' must be"):
        load_contract_file(_write(tmp_path, doc))
    doc = load_contract("classic")
    doc["orders"]["discount"] = "whatever"
    with pytest.raises(ContractError, match=r"'orders\.discount' is not a column"):
        load_contract_file(_write(tmp_path, doc))
    (tmp_path / "bad.yaml").write_text("limits: [unclosed")
    with pytest.raises(ContractError, match="bad.yaml: not valid YAML"):
        load_contract_file(tmp_path / "bad.yaml")


def test_schema_checks_are_named_after_defect_types():
    contract = load_contract("classic")
    for table in ("orders", "customers"):
        schema = build_schema(contract, table)
        names = [c.name for col in schema.columns.values() for c in col.checks] + [c.name for c in schema.checks]
        assert sorted(names) == sorted(r.defect_type for r in rules_for(contract, table))
        assert set(names) <= set(DEFECT_TYPES)
    assert len(CATALOGUE) == 11


def _orders(**over):
    row = {"order_id": "O1", "customer_id": "C1", "amount": "100.00", "currency": "USD",
           "status": "placed", "order_date": "2026-09-10"}
    row.update(over)
    return frame([row], list(row))


@pytest.mark.parametrize("over, cite", [
    ({}, None),
    ({"amount": ""}, ("amount", "missing_value")),
    ({"amount": "90000.00"}, ("amount", "out_of_range")),
    ({"amount": "-5.00"}, ("amount", "out_of_range")),
    ({"amount": "-5.00", "status": "refunded"}, None),
    ({"amount": "50000.00"}, None),
    ({"currency": "EUR"}, ("currency", "wrong_currency")),
    ({"status": "Delivered"}, ("status", "invalid_value")),
    ({"status": "shipped "}, ("status", "invalid_value")),
    ({"order_date": "2026-08-31"}, ("order_date", "out_of_window")),
    ({"order_date": "2026-09-30"}, None),
    ({"customer_id": "C999"}, ("customer_id", "orphan_reference")),
    ({"order_id": "O7"}, ("order_id", "duplicate_key")),
])
def test_each_orders_rule_cites_its_defect(over, cite):
    contract = load_contract("classic")
    keys = {"customer_id": {"C1"}, "order_id": {"O7"}}
    rules = rules_for(contract, "orders")
    failed, _ = failing_rules(build_schema(contract, "orders", keys), _orders(**over), rules)
    assert ((failed[0].column, failed[0].defect_type) if failed else None) == cite


def test_schemas_follow_the_document_not_a_second_copy():
    contract = load_contract("classic")
    contract["limits"]["max_amount"] = 10000
    contract["reporting_window"]["end"] = "2026-09-29"
    failed, _ = failing_rules(build_schema(contract, "orders", {"customer_id": {"C1"}}),
                              _orders(amount="20000.00"), rules_for(contract, "orders"))
    assert failed and failed[0].defect_type == "out_of_range"
    failed, _ = failing_rules(build_schema(contract, "orders", {"customer_id": {"C1"}}),
                              _orders(order_date="2026-09-30"), rules_for(contract, "orders"))
    assert failed and failed[0].defect_type == "out_of_window"
    del contract["orders"]["customer_id"]  # a contract that states no customer reference checks none
    assert "orphan_reference" not in [r.defect_type for r in rules_for(contract, "orders")]


def test_committed_contract_file_loads():
    assert load_contract_file(ROOT / "contracts" / "classic.yaml")["reporting_window"] == {
        "start": "2026-09-01", "end": "2026-09-30"}


def test_load_contract_reads_the_directory_it_is_given(tmp_path):
    doc = load_contract("classic")
    doc["limits"]["max_amount"] = 777
    (tmp_path / "classic.yaml").write_text(yaml.safe_dump(doc))
    assert load_contract("classic", tmp_path)["limits"]["max_amount"] == 777
    assert load_contract("classic")["limits"]["max_amount"] == 50000  # the shipped one, unchanged
    with pytest.raises(ContractError, match=r"nope\.yaml: no such contract file"):
        load_contract("nope", tmp_path)


def test_yaml_is_read_as_yaml_1_2_and_a_key_named_twice_is_refused(tmp_path):
    """PyYAML reads YAML 1.1: `010000` was octal 4096, `50:00` was 3000, `5.0e4` and `1e5` were text, `NO` was
    False; and a key named twice silently kept its last value (a second `limits:` block replaced the first)."""
    from gate_pipeline.kernel.contract import read_yaml
    p = tmp_path / "x.yaml"
    for text, value in (("010000", 10000), ("50:00", "50:00"), ("5.0e4", 50000.0), ("1e5", 100000.0), ("NO", "NO"),
                        ("yes", "yes"), ("true", True), ("0x1F", 31), ("-.inf", float("-inf")), ("2_0", "2_0")):
        p.write_text(f"a: {text}\n")
        assert read_yaml(p) == {"a": value}, text
    p.write_text("limits:\n  max_amount: 5\nlimits:\n  max_amount: 7\n")
    with pytest.raises(ContractError, match="found the key 'limits' twice in one mapping, at line 3"):
        read_yaml(p)
    doc = load_contract("classic")
    doc["limits"]["max_amount"] = 10000
    p.write_text(yaml.safe_dump(doc).replace("max_amount: 10000", "max_amount: 010000"))
    assert load_contract_file(p)["limits"]["max_amount"] == 10000


class _PythonParsed(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                    contract_module._ContractLoader):
    """gate's contract loader with PyYAML's own parser in Python, whatever parser gate's is built on."""

    def __init__(self, stream):
        yaml.SafeLoader.__init__(self, stream)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml: gate reads with PyYAML's own parser")
def test_libyaml_reads_every_shipped_file_and_the_edge_cases_as_pyyamls_own_parser_does(tmp_path):
    """Contracts and variants are read with libyaml's parser (in C) where PyYAML has it: every file gate ships, and
    text where the two could differ, reads to the same document, or the same refusal, as with PyYAML's parser."""
    from gate_pipeline.kernel.contract import read_yaml
    assert issubclass(contract_module._ContractLoader, yaml.CSafeLoader)
    files = sorted((ROOT / "gate_pipeline" / "data" / "contracts").rglob("*.yaml"))
    assert len(files) >= 38
    texts = [f.read_text() for f in files] + [
        "a: 010000\nb: 50:00\nc: 5.0e4\nd: NO\ne: 0x1F\nf: -.inf\ng: 2_0\nh: ~\ni: 2026-09-30\n",
        "a: 'x'\nb: \"y\\u00e9\"\nc: |\n  two\n  lines\nd: >\n  folded\n  text\n",
        "a: [1, 2, {b: c}]\nd: {e: [f, g]}\n", "- 1\n- - 2\n  - 3\n", "\ufeffa: 1\n", "a: 1\r\nb: 2\r\n",
        "a: b: c\n", "a: [1, 2\n", "a:\n\t- 1\n", "a: \"\\x\"\n", "a: \x07\n", ""]
    for k, text in enumerate(texts):
        path = tmp_path / f"{k}.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            ours = read_yaml(path)
        except ContractError:
            ours = ContractError
        try:
            theirs = yaml.load(text, Loader=_PythonParsed)  # noqa: S506 - gate's safe loader, parsed in Python
        except yaml.YAMLError:
            theirs = ContractError
        assert ours == theirs, (files[k] if k < len(files) else text)
    deep = tmp_path / "deep.yaml"  # libyaml refuses past 1,000 levels as it reads ahead: gate says why, not libyaml's words
    deep.write_text("variant: " + "[" * 1001 + "]" * 1001 + "\n")
    with pytest.raises(ContractError, match="nested deeper than 20 levels"):
        read_yaml(deep)


@pytest.mark.parametrize("text, says", [
    ("a: !!set [x]\n", "not valid YAML"), ("a: !!map [x]\n", "not valid YAML"), ("!!set [x]\n", "not valid YAML"),
    ("a: &x 1\nb: *x\n", "YAML anchors and aliases are not allowed"),
    ("a: " + "[" * 21 + "]" * 21 + "\n", "YAML nested deeper than 20 levels")])
def test_a_mapping_tag_on_a_sequence_and_gates_own_refusals_are_one_line_naming_the_file_once(tmp_path, text, says):
    """An outside reviewer's: `!!set [x]` made the duplicate-key check unpack a scalar node (a TypeError traceback
    from `gate experiment` with such a variant), and gate's own refusals (ContractError is a ValueError) were
    wrapped again as 'not a usable contract', naming the file twice."""
    from gate_pipeline.kernel.contract import read_yaml
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(ContractError) as caught:
        read_yaml(path)
    message = str(caught.value)
    assert says in message and message.count(str(path)) == 1 and "\n" not in message, message


def test_a_reporting_window_that_ends_before_it_starts_is_refused_in_the_contract_itself(tmp_path):
    """Only variants were checked for it (and the error blamed the variant); a contract, and the cases generated
    from it, carried the reversed window, and careful scored 0.35 on a clean case."""
    for suite in ("classic", "v2"):
        doc = load_contract(suite)
        doc["reporting_window"]["start"] = "2027-01-01"
        p = tmp_path / f"{suite}.yaml"
        p.write_text(yaml.safe_dump(doc))
        with pytest.raises(ContractError, match=r"key 'reporting_window' starts after it ends \(2027-01-01 > "):
            load_contract_file(p)
