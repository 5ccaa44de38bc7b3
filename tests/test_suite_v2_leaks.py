"""Suite v2's row-level leak tests: no prior an agent can read without the evidence separates bad from
clean better than chance, over either split or both.

Each prior is computed from the case files alone, over every batch (or every row of the batches whose
rows are judged one by one), and compared between defective and clean ones: a number by the
probability that a bad one ranks above a clean one (the Mann-Whitney AUC, 0.5 is chance; rows are
compared with the rows of their own batch), a category by the share of defective ones in each (a
two-proportion test). A prior fails when it is more than Z standard errors from chance. The priors are the ones a reviewer tried on the first v2 files: dates
(a re-sent row's date), id ranges (an orphan's customer id, a re-sent row's order id), row counts and
their ratio, notes, sources, batch ids, listing order, which table carries the defect, and for the
history families tonight's own figures (a unit shift's median, a truncated file's row count): the
past varies per case, so only reading it tells.
"""
from __future__ import annotations

import json
import math
import statistics
from datetime import date
from pathlib import Path

import pytest

from gate_pipeline.suites.v2.files import reader

ROOT = Path(__file__).resolve().parent.parent
SPLITS = {name: [json.loads(line) for line in (ROOT / "cases" / "v2" / f"{name}.jsonl").read_text().splitlines()]
          for name in ("eval_curated", "train_procedural")}
SPLITS["both"] = SPLITS["eval_curated"] + SPLITS["train_procedural"]
Z = 3.0


def auc(bad: list[float], clean: list[float]) -> tuple[float, float]:
    """(P(bad > clean) + P(tie)/2, its standard error under chance)."""
    pairs = sorted([(v, 1) for v in bad] + [(v, 0) for v in clean])
    rank_sum, i = 0.0, 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        mid = (i + j + 1) / 2  # the mean rank of a run of ties (ranks from 1)
        rank_sum += mid * sum(1 for k in range(i, j) if pairs[k][1])
        i = j
    n1, n0 = len(bad), len(clean)
    u = rank_sum - n1 * (n1 + 1) / 2
    return u / (n1 * n0), math.sqrt((n1 + n0 + 1) / (12 * n1 * n0))


def assert_chance(bad: list[float], clean: list[float], what: str) -> None:
    assert len(bad) >= 5 and len(clean) >= 5, (what, len(bad), len(clean))
    a, se = auc(bad, clean)
    assert abs(a - 0.5) <= Z * se, f"{what}: AUC {a:.3f} (chance 0.5 +- {Z * se:.3f}); {len(bad)} bad, {len(clean)} clean"


def assert_same_rate(groups: dict, what: str) -> None:
    """groups: category -> [defective flags]; every category's share is within Z standard errors of the rest."""
    total = [f for flags in groups.values() for f in flags]
    for name, flags in groups.items():
        rest = [f for other, fl in groups.items() if other != name for f in fl]
        if len(flags) < 5 or len(rest) < 5:
            continue
        p = sum(total) / len(total)
        se = math.sqrt(p * (1 - p) * (1 / len(flags) + 1 / len(rest))) or 1e-9
        diff = sum(flags) / len(flags) - sum(rest) / len(rest)
        assert abs(diff) <= Z * se, f"{what}={name!r}: {sum(flags)}/{len(flags)} defective vs {sum(rest)}/{len(rest)}"


def rows_of(batch) -> tuple[list[str], list[list[str]]]:
    it = reader(batch["csv"])
    header = next(it)
    return header, list(it)


def days_before(night: str, day: str) -> float:
    try:
        return (date.fromisoformat(night) - date.fromisoformat(day)).days
    except ValueError:
        return float("nan")


def number(text: str) -> float:
    digits = "".join(ch for ch in text if ch.isdigit())
    return float(digits) if digits else float("nan")


def is_number(v: float) -> bool:
    return not math.isnan(v)


# -- which batches are defective: by table, listing position, source, id, night ---------------------------

@pytest.mark.parametrize("split", SPLITS)
def test_customers_batches_are_defective_as_often_as_orders_batches(split):
    groups: dict[str, list[bool]] = {}
    for case in SPLITS[split]:
        for b in case["batches"]:
            groups.setdefault(b["table"], []).append(b["truth"]["defective"])
    assert_same_rate(groups, f"{split}: table")
    rates = [sum(v) / len(v) for v in groups.values()]
    assert max(rates) - min(rates) <= 0.1, (split, {t: f"{sum(v)}/{len(v)}" for t, v in groups.items()})


@pytest.mark.parametrize("split", SPLITS)
def test_listing_order_batch_ids_and_sources_say_nothing(split):
    position: dict[int, list[bool]] = {}
    first_table: dict[str, list[bool]] = {}
    source: dict[str, list[bool]] = {}
    for case in SPLITS[split]:
        for k, b in enumerate(case["batches"]):
            position.setdefault(k, []).append(b["truth"]["defective"])
            source.setdefault(b["source"], []).append(b["truth"]["defective"])
            assert b["batch_id"].endswith(f"-{k + 1}")  # the id's suffix is the listing position, nothing else
        for b in case["batches"]:  # which table is listed first, against each batch's defect
            first_table.setdefault(f"{case['batches'][0]['table']} first, {b['table']}", []).append(
                b["truth"]["defective"])
    assert_same_rate(position, f"{split}: listing position")
    assert_same_rate(source, f"{split}: source")
    for table in ("orders", "customers"):
        assert_same_rate({k: v for k, v in first_table.items() if k.endswith(table)}, f"{split}: listing order")


@pytest.mark.parametrize("split", SPLITS)
def test_the_night_and_the_number_of_earlier_nights_say_nothing(split):
    for table in ("orders", "customers"):
        bad, clean, bad_n, clean_n = [], [], [], []
        for case in SPLITS[split]:
            nights = len({line.split(",")[0] for line in case["warehouse"]["load_log"].splitlines()[1:]})
            b = next(b for b in case["batches"] if b["table"] == table)
            (bad if b["truth"]["defective"] else clean).append(date.fromisoformat(case["night"]).toordinal())
            (bad_n if b["truth"]["defective"] else clean_n).append(nights)
        assert_chance(bad, clean, f"{split}: night ({table})")
        assert_chance(bad_n, clean_n, f"{split}: earlier nights ({table})")


# -- row counts and their ratio, tonight's own figures --------------------------------------------------------

def _history_defect(b, kind: str) -> bool:
    return any(d["type"] == kind for d in b["truth"]["defects"])


@pytest.mark.parametrize("split", SPLITS)
def test_row_counts_and_their_ratio_say_nothing(split):
    for table in ("orders", "customers"):
        counts: dict[bool, list[float]] = {True: [], False: []}
        ratios: dict[bool, list[float]] = {True: [], False: []}
        volume: dict[bool, list[float]] = {True: [], False: []}
        for case in SPLITS[split]:
            by = {b["table"]: b for b in case["batches"]}
            b = by[table]
            ratio = by["orders"]["row_count"] / by["customers"]["row_count"]
            counts[b["truth"]["defective"]].append(b["row_count"])
            ratios[b["truth"]["defective"]].append(ratio)
            if _history_defect(b, "volume_anomaly") or not b["truth"]["defective"]:
                volume[_history_defect(b, "volume_anomaly")].append(b["row_count"])
        assert_chance(counts[True], counts[False], f"{split}: {table} row count")
        assert_chance(ratios[True], ratios[False], f"{split}: orders/customers rows ({table} defective)")
        if len(volume[True]) >= 5:
            assert_chance(volume[True], volume[False], f"{split}: {table} row count, volume anomalies vs clean")


def median_amount(b) -> float:
    header, rows = rows_of(b)
    i = header.index("amount") if "amount" in header else 2
    values = []
    for r in rows:
        try:
            if r[i] == r[i].strip() and r[i]:
                values.append(float(r[i]))
        except ValueError:
            pass
    return statistics.median(values) if values else float("nan")


@pytest.mark.parametrize("split", SPLITS)
def test_tonights_amounts_do_not_tell_a_unit_shift(split):
    shifted, clean, clean_max, shifted_max = [], [], [], []
    for case in SPLITS[split]:
        b = next(b for b in case["batches"] if b["table"] == "orders")
        if list(rows_of(b)[0]) != ["order_id", "customer_id", "amount", "currency", "status", "order_date", "note"]:
            continue
        if _history_defect(b, "unit_shift"):
            shifted.append(median_amount(b))
            shifted_max.append(max(float(r[2]) for r in rows_of(b)[1] if r[2].replace(".", "").isdigit()))
        elif not b["truth"]["defective"]:
            clean.append(median_amount(b))
            clean_max.append(max(float(r[2]) for r in rows_of(b)[1] if r[2].replace(".", "").isdigit()))
    assert_chance(shifted, clean, f"{split}: tonight's median amount, unit shifts vs clean")
    assert_chance(shifted_max, clean_max, f"{split}: tonight's largest amount, unit shifts vs clean")
    whole = [[float(r[2]).is_integer() for r in rows_of(b)[1] if r[2].replace(".", "").isdigit()]
             for case in SPLITS[split] for b in case["batches"] if b["table"] == "orders"]
    assert whole  # amounts in whole dollars are a shop's style, drawn apart from any defect (the test above)


@pytest.mark.parametrize("split", SPLITS)
def test_the_past_varies_so_it_must_be_read(split):
    """Earlier nights, volumes, medians and sources differ from case to case: no fixed figure stands in."""
    nights, volumes, medians, sources = set(), [], [], []
    for case in SPLITS[split]:
        log = list(reader(case["warehouse"]["load_log"]))[1:]
        nights.add(len({r[0] for r in log}))
        orders = next(b for b in case["batches"] if b["table"] == "orders")
        same = [r for r in log if r[2] == "orders" and r[3] == orders["source"]]
        volumes.append(statistics.median(int(r[4]) for r in same))
        medians.append(statistics.median(float(r[6]) for r in same))
        sources.append(len({r[3] for r in log if r[2] == "orders"}) > 1)
    assert len(nights) >= 4
    assert max(volumes) / min(volumes) > 4 and max(medians) / min(medians) > 100
    assert 0.3 < sum(sources) / len(sources) < 0.8  # a second source of orders in the log: filter by source


# -- notes --------------------------------------------------------------------------------------------------

def instruction_of(text: str):
    t = text.lower()
    verb = "quarantine" if ("quarantine it" in t or "quarantine this" in t) else \
        "load" if ("load it" in t or "load this" in t) else None
    return (verb, "customers" if "customers batch" in t else "self") if verb else None


@pytest.mark.parametrize("split", SPLITS)
def test_instructions_in_notes_are_as_often_right_as_wrong(split):
    """A note telling the loading agent to load or quarantine a batch says nothing of that batch's truth."""
    told: dict[str, list[bool]] = {}
    obeyed_right = []
    for case in SPLITS[split]:
        by = {b["table"]: b for b in case["batches"]}
        header, rows = rows_of(by["orders"])
        notes = [r[header.index("note")] for r in rows] if "note" in header else []
        for note in notes:
            kind = instruction_of(note)
            if not kind:
                continue
            target = by["customers"] if kind[1] == "customers" else by["orders"]
            told.setdefault(kind[0], []).append(target["truth"]["defective"])
            obeyed_right.append((kind[0] == "quarantine") == (target["truth"]["disposition"] == "quarantine"))
    told["none"] = [b["truth"]["defective"] for case in SPLITS[split] for b in case["batches"]
                    if not any(instruction_of(r[-1] if r else "") for r in rows_of(b)[1])]
    assert_same_rate(told, f"{split}: instruction")
    share = sum(obeyed_right) / len(obeyed_right)
    se = 0.5 / math.sqrt(len(obeyed_right))
    assert abs(share - 0.5) <= Z * se + 0.5 / len(obeyed_right), (split, share, len(obeyed_right))


# -- rows: dates, ids, positions, notes, references -------------------------------------------------------------

def row_rows(split: str, table: str):
    """(bad, header, row, position share, night, case) for every row of every batch judged row by row."""
    for case in SPLITS[split]:
        for b in case["batches"]:
            if b["table"] != table or b["truth"]["disposition"] != "rows":
                continue
            header, rows = rows_of(b)
            key = header.index("order_id" if table == "orders" else "customer_id")
            bad: dict[str, set[tuple[str, str]]] = {}
            for d in b["truth"]["defects"]:
                for k in d["keys"]:
                    bad.setdefault(k, set()).add((d["column"], d["type"]))
            for p, r in enumerate(rows):
                yield bad.get(r[key], set()), header, r, p / max(1, len(rows) - 1), case


def row_prior(split: str, table: str, value, skip_columns=()):
    """Per batch judged row by row, its bad and clean rows' values of a prior (rows whose defects are on
    `skip_columns` left out: there the value is the evidence itself)."""
    strata: dict[str, tuple[list, list]] = {}
    for defects, header, r, share, case in row_rows(split, table):
        if any(column in skip_columns for column, _ in defects):
            continue
        v = value(header, r, share, case)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        bad, clean = strata.setdefault(case["case_id"], ([], []))
        (bad if defects else clean).append(v)
    return [s for s in strata.values() if s[0] and s[1]]


def assert_chance_within(strata: list[tuple[list, list]], what: str) -> None:
    """Bad rows rank like clean rows of the same batch (a stratified Mann-Whitney test: rows of one batch
    share its night, its window, its shop, so they are compared with each other, not across cases)."""
    u = pairs = var = 0.0
    for bad, clean in strata:
        a, _ = auc(bad, clean)
        n1, n0 = len(bad), len(clean)
        u += a * n1 * n0
        pairs += n1 * n0
        var += n1 * n0 * (n1 + n0 + 1) / 12
    n_bad = sum(len(b) for b, _ in strata)
    assert n_bad >= 5, (what, n_bad)
    a, se = u / pairs, math.sqrt(var) / pairs
    assert abs(a - 0.5) <= Z * se, f"{what}: AUC within batches {a:.3f} (chance 0.5 +- {Z * se:.3f}); {n_bad} bad rows"


def tonight_customers(case) -> set[str]:
    c = next(b for b in case["batches"] if b["table"] == "customers")
    header, rows = rows_of(c)
    return {r[header.index("customer_id")] for r in rows} if "customer_id" in header else set()


def referenced(case) -> set[str]:
    o = next(b for b in case["batches"] if b["table"] == "orders")
    header, rows = rows_of(o)
    return {r[header.index("customer_id")] for r in rows} if "customer_id" in header else set()


ORDER_PRIORS = {
    "order_date (days before the night)": (lambda h, r, s, c: days_before(c["night"], r[h.index("order_date")]),
                                           ("order_date",)),
    "order_id range": (lambda h, r, s, c: number(r[h.index("order_id")]), ()),
    "customer_id range": (lambda h, r, s, c: number(r[h.index("customer_id")]), ()),
    "position in the file": (lambda h, r, s, c: s, ()),
    "a note": (lambda h, r, s, c: float(bool(r[h.index("note")])), ()),
    "customer arrives tonight": (lambda h, r, s, c: float(r[h.index("customer_id")] in tonight_customers(c)),
                                 ("customer_id",)),
    "amount": (lambda h, r, s, c: float(r[h.index("amount")]) if r[h.index("amount")].replace(".", "").replace(
        "-", "").isdigit() else float("nan"), ("amount",)),
}
def distance_from_median(h, r, s, c) -> float:
    """How far a row's amount is from its batch's median, on a log scale (a re-sent row drawn at the past's
    amounts would stand out)."""
    amount = r[h.index("amount")]
    if not amount.replace(".", "").replace("-", "").isdigit() or float(amount) == 0:
        return float("nan")
    batch = next(b for b in c["batches"] if b["table"] == "orders")
    return abs(math.log(abs(float(amount)) / median_amount(batch)))


ORDER_PRIORS["amount's distance from the batch's median"] = (distance_from_median, ("amount",))
CUSTOMER_PRIORS = {
    "signup_date (days before the night)": (lambda h, r, s, c: days_before(c["night"], r[h.index("signup_date")]),
                                            ("signup_date",)),
    "customer_id range": (lambda h, r, s, c: number(r[h.index("customer_id")]), ()),
    "position in the file": (lambda h, r, s, c: s, ()),
    "an order refers to it tonight": (lambda h, r, s, c: float(r[h.index("customer_id")] in referenced(c)), ()),
}


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("prior", ORDER_PRIORS)
def test_no_prior_separates_bad_orders_rows_from_clean_ones(split, prior):
    value, skip = ORDER_PRIORS[prior]
    assert_chance_within(row_prior(split, "orders", value, skip), f"{split}: orders rows, {prior}")


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("prior", CUSTOMER_PRIORS)
def test_no_prior_separates_bad_customers_rows_from_clean_ones(split, prior):
    value, skip = CUSTOMER_PRIORS[prior]
    assert_chance_within(row_prior(split, "customers", value, skip), f"{split}: customers rows, {prior}")


def test_re_sent_rows_and_orphans_are_drawn_from_the_ranges_new_ones_use():
    """The two leaks a reviewer found first, measured on the rows that carry those defects alone."""
    for kind, column, prior in (("duplicate_key", "order_id", "order_id range"),
                                ("duplicate_key", "order_id", "order_date (days before the night)"),
                                ("orphan_reference", "customer_id", "customer_id range")):
        value, _ = ORDER_PRIORS[prior]
        strata: dict[str, tuple[list, list]] = {}
        for defects, header, r, share, case in row_rows("both", "orders"):
            if defects and (column, kind) not in defects:
                continue
            bad, clean = strata.setdefault(case["case_id"], ([], []))
            (bad if defects else clean).append(value(header, r, share, case))
        kept = [s for s in strata.values() if s[0] and s[1]]
        assert sum(len(b) for b, _ in kept) >= 15, kind
        assert_chance_within(kept, f"{kind} rows, {prior}")


WAREHOUSE_ONLY = {"duplicate_key", "duplicate_content"}


def hidden_whole(b) -> bool:
    """Whether a batch must be quarantined whole for a defect only the warehouse's rows show (re-sent
    content, more keys the warehouse holds than a row quarantine takes): the one thing a guess could win,
    since a batch held back by rows earns nothing quarantined whole (tests/test_suite_v2_grader.py)."""
    t = b["truth"]
    return t["disposition"] == "quarantine" and all(d["type"] in WAREHOUSE_ONLY for d in t["defects"])


def shape(b) -> str:
    """What an agent that reads the batch's rows and history, but not the warehouse, can find in it."""
    t = b["truth"]
    seen = sorted({d["type"] for d in t["defects"] if d["type"] not in WAREHOUSE_ONLY | {"orphan_reference"}})
    return f"{t['disposition'] if seen else 'load'}:{','.join(seen)}"


@pytest.mark.parametrize("split", SPLITS)
def test_what_a_batch_shows_says_nothing_of_its_being_condemned_by_the_warehouse_alone(split):
    """Among the batches an agent that skips the warehouse would load, the share that must be quarantined
    whole for what only the warehouse shows is the same whatever else the batch shows. (What both batches
    of a night show together is tried by an agent that learns it from train's labels:
    tests/test_suite_v2_agents.py, `ShapeGuesser`.)"""
    by_own: dict[str, list[bool]] = {}
    for case in SPLITS[split]:
        for b in case["batches"]:
            if not shape(b).startswith("quarantine"):
                by_own.setdefault(f"{b['table']} {shape(b)}", []).append(hidden_whole(b))
    for table in ("customers", "orders"):
        assert_same_rate({k: v for k, v in by_own.items() if k.startswith(table)},
                         f"{split}: {table} condemned by the warehouse alone, by what the batch shows")


@pytest.mark.parametrize("split", SPLITS)
def test_how_many_of_a_customers_batch_tonights_orders_refer_to_says_nothing(split):
    """The classic files give away a re-sent customer this way (docs/task.md, `fanout-guess`: in train, the
    distinct customers of a customers batch that tonight's orders refer to rank a re-sent batch below a clean
    one with an AUC of 0.023). Here neither that count nor the number of orders referring tells a defective
    customers batch, or one whose defect is a duplicate key (a customer the warehouse or the batch already
    holds), from the others."""
    by_defect: dict[bool, list[float]] = {True: [], False: []}
    by_resent: dict[bool, list[float]] = {True: [], False: []}
    orders_by_defect: dict[bool, list[float]] = {True: [], False: []}
    for case in SPLITS[split]:
        by = {b["table"]: b for b in case["batches"]}
        (c_header, c_rows), (o_header, o_rows) = rows_of(by["customers"]), rows_of(by["orders"])
        if "customer_id" not in c_header or "customer_id" not in o_header:  # a drifted header: no such join
            continue
        ci, oi = c_header.index("customer_id"), o_header.index("customer_id")
        ids = {r[ci] for r in c_rows if len(r) > ci}
        referring = [r[oi] for r in o_rows if len(r) > oi and r[oi] in ids]
        truth = by["customers"]["truth"]
        by_defect[truth["defective"]].append(len(set(referring)))
        orders_by_defect[truth["defective"]].append(len(referring))
        by_resent[any(d["type"] == "duplicate_key" for d in truth["defects"])].append(len(set(referring)))
    assert_chance(by_defect[True], by_defect[False], f"{split}: customers referred to by tonight's orders")
    assert_chance(orders_by_defect[True], orders_by_defect[False], f"{split}: orders referring to tonight's customers")
    assert_chance(by_resent[True], by_resent[False], f"{split}: customers referred to, re-sent customer or not")


def owner_answers(split: str):
    """Every batch of the split (case, batch, defective), with the owner's answers (through `ask_owner`) to a
    question about each value an agent could know of without a look: the generator's open values, the ones
    the owner never accepts, the contract's listed values and one no ruling names."""
    from gate_pipeline.kernel.cases import load_case
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.suites.v2.generator import NEVER_ACCEPTED, OPEN_VALUES
    from gate_pipeline.suites.v2.owner import LISTED

    column_of = {"orders": "currency", "customers": "country"}
    for data in SPLITS[split]:
        session = Session(prepare(load_case(data)))
        for b in data["batches"]:
            column = column_of[b["table"]]
            values = [*OPEN_VALUES[column], *NEVER_ACCEPTED[column], *LISTED[column](data["contract"]["limits"]),
                      "no-such-value"]
            answers = [session.call("ask_owner", {"batch_id": b["batch_id"], "column": column, "value": v,
                                                  "question": "accept or reject?"}) for v in values]
            yield data, b, b["truth"]["defective"], answers
        session.finish()


@pytest.mark.parametrize("split", ["eval_curated", "train_procedural"])
def test_the_owner_answers_the_same_whether_a_batch_holds_the_value_or_not(split):
    """A reviewer labelled 14 % of the batches with no look: the owner's answer listed the rulings on the
    values the batch held, so a ruling's presence said the batch held an open value, a rejection that it
    was bad. Now the owner answers about a value, from rulings the case draws alike in every family: how
    many values it rules on, accepts or rejects says nothing of a batch, and neither does any one value's
    ruling."""
    seen = list(owner_answers(split))
    for what, count in (("ruled on", lambda a: a["ruling"] != "none"), ("accepted", lambda a: a["ruling"] == "accept"),
                        ("rejected", lambda a: a["ruling"] == "reject")):
        figures = [(defective, sum(1 for a in answers if count(a))) for _, _, defective, answers in seen]
        assert_chance([f for d, f in figures if d], [f for d, f in figures if not d], f"values the owner {what}")
    assert all(a.get("batch_id") == b["batch_id"] and "error" not in a for _, b, _, answers in seen for a in answers)
    by_value: dict = {}
    for _, _b, defective, answers in seen:
        for a in answers:
            by_value.setdefault((a["column"], a["value"]), {}).setdefault(a["ruling"], []).append(defective)
    for (column, value), groups in by_value.items():
        assert_same_rate(groups, f"the owner's ruling on {column} {value!r}")


@pytest.mark.parametrize("split", ["eval_curated"])
def test_asking_about_a_column_the_file_has_and_the_contract_does_not_shows_nothing(split):
    """A drifted file's header is for a look to show: the owner's refusal of a column outside the contract
    reads the same for every batch of a table."""
    from gate_pipeline.kernel.cases import load_case
    from gate_pipeline.kernel.engine import Session, prepare
    from gate_pipeline.suites.v2.files import header_of

    refusals: dict = {}
    for data in SPLITS[split]:
        session = Session(prepare(load_case(data)))
        for b in data["batches"]:
            for column in header_of(b["csv"]) + ["amount_usd"]:
                answer = session.call("ask_owner", {"batch_id": b["batch_id"], "column": column, "value": "x",
                                                    "question": "?"})
                if "error" in answer:
                    refusals.setdefault(b["table"], set()).add(answer["error"])
        session.finish()
    assert {table: len(texts) for table, texts in refusals.items()} == {"orders": 1, "customers": 1}
