"""The classic suite's seeded case generator: eight families, fixed seeds, exact draw order.

Every random draw happens in the order CONFORMANCE §8 gives, from one `random.Random(seed)`
per case, so the files come out byte-identical to the classic suite's. Change nothing here
without regenerating and checking the sha256 pins in the tests.
"""
from __future__ import annotations

import copy
import random
from pathlib import Path

from ...kernel.cases import procedural_draws, write_cases
from ...kernel.contract import load_contract

FAMILIES = (
    "clean-control", "resent-rows", "amount-bounds", "blank-amount",
    "orphan-customer", "label-drift", "dimension-fanout", "legit-edge",
)
COUNTRIES = ("US", "CA", "GB", "DE", "FR", "KR", "JP", "AU")
CLEAN_STATUSES = ("placed", "shipped", "delivered", "returned")


ORDER_SOURCES = ["shop-api export", "pos export", "shop-api export (retry)"]
EVAL_BASE_SEED = 20260930
TRAIN_SEED, TRAIN_CASES = 7, 320
PROMPT = ("September close, run on 2026-10-01. {n} batch{es} waiting in staging. Load what meets "
          "the data contract, quarantine what does not, then submit your report.")


def _clean() -> dict:
    return {"defective": False, "defects": []}


def _defect(column: str, kind: str, accepted: list | None = None) -> dict:
    truth = {"defective": True, "defects": [{"column": column, "type": kind}]}
    if accepted:
        truth["accepted"] = [{"column": c, "type": t} for c, t in accepted]
    return truth


class _CaseBuilder:
    """One case's draws. Method order mirrors the spec's steps; each method draws in spec order."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.used: set[str] = set()
        self.batches: list[dict] = []

    def _new_id(self, prefix: str, lo: int, hi: int) -> str:
        while True:
            ident = f"{prefix}{self.rng.randint(lo, hi)}"
            if ident not in self.used:
                self.used.add(ident)
                return ident

    def customer_id(self) -> str:
        return self._new_id("C", 100, 899)

    def order_id(self) -> str:
        return self._new_id("O", 10000, 99999)

    def customer(self) -> dict:
        rng = self.rng
        cid = self.customer_id()
        country = rng.choice(COUNTRIES)
        month = rng.randint(1, 9)
        day = rng.randint(1, 28)
        return {"customer_id": cid, "email": f"{cid.lower()}@example.com", "country": country,
                "signup_date": f"2026-0{month}-{day:02d}"}

    def order(self, customers: list[dict]) -> dict:
        rng = self.rng
        oid = self.order_id()
        cid = rng.choice(customers)["customer_id"]
        amount = "%.2f" % rng.uniform(12, 1900)
        status = rng.choice(CLEAN_STATUSES)
        date = "2026-09-%02d" % rng.randint(1, 30)
        return {"order_id": oid, "customer_id": cid, "amount": amount, "currency": "USD",
                "status": status, "order_date": date}

    def warehouse(self) -> None:
        self.wh_customers = [self.customer() for _ in range(20)]
        self.wh_orders = [self.order(self.wh_customers) for _ in range(30)]

    def clean_orders(self) -> list[dict]:
        n = self.rng.randint(12, 20)
        return [self.order(self.wh_customers) for _ in range(n)]

    def clean_customers(self) -> list[dict]:
        n = self.rng.randint(3, 6)
        return [self.customer() for _ in range(n)]

    def pick(self, rows: list) -> int:
        return self.rng.choice(list(range(len(rows))))

    def add_orders(self, rows: list[dict], truth: dict | None = None) -> None:
        source = self.rng.choice(ORDER_SOURCES)
        self.batches.append({"rows": rows, "source": source, "table": "orders", "truth": truth or _clean()})

    def add_customers(self, rows: list[dict], truth: dict | None = None) -> None:
        self.batches.append({"rows": rows, "source": "crm sync", "table": "customers", "truth": truth or _clean()})

    def new_customers_with_orders(self, rows: list[dict]) -> None:
        new = self.clean_customers()
        self.add_customers(new)
        for j in self.rng.sample(range(len(rows)), 3):
            rows[j]["customer_id"] = self.rng.choice(new)["customer_id"]


def _family_body(b: _CaseBuilder, family: str, v: int) -> None:
    rng = b.rng
    if family == "dimension-fanout":
        new = b.clean_customers()
        dup = copy.copy(rng.choice(b.wh_customers))
        new[rng.randrange(len(new))] = dup
        b.add_customers(new, _defect("customer_id", "duplicate_key"))
        rows = b.clean_orders()
        rows[0]["customer_id"] = dup["customer_id"]
        b.add_orders(rows)
        return
    rows = b.clean_orders()
    n = len(rows)
    if family == "clean-control":
        if v in (1, 3):
            b.new_customers_with_orders(rows)
            b.add_orders(rows)
        else:
            b.add_orders(rows)
            b.add_orders(b.clean_orders())
    elif family == "resent-rows":
        if v in (0, 1):
            for i in rng.sample(range(n), 3):
                rows[i] = copy.copy(rng.choice(b.wh_orders))
        else:
            i, j = rng.sample(range(n), 2)
            rows[j] = copy.copy(rows[i])
        b.add_orders(rows, _defect("order_id", "duplicate_key"))
    elif family == "amount-bounds":
        i = b.pick(rows)
        if v in (0, 2):
            rows[i]["amount"] = "%.2f" % (rng.randint(900, 4800) * 100)
        else:
            rows[i]["amount"] = "-%.2f" % rng.uniform(20, 600)
            rows[i]["status"] = rng.choice(["placed", "shipped"])
        b.add_orders(rows, _defect("amount", "out_of_range"))
    elif family == "blank-amount":
        rows[b.pick(rows)]["amount"] = "" if v < 2 else "   "
        b.add_orders(rows, _defect("amount", "missing_value",
                                   accepted=[("amount", "missing_value"), ("amount", "out_of_range")]))
    elif family == "orphan-customer":
        orphan = b.customer_id()
        rows[b.pick(rows)]["customer_id"] = orphan
        b.add_orders(rows, _defect("customer_id", "orphan_reference"))
    elif family == "label-drift":
        i = b.pick(rows)
        if v == 0:
            rows[i]["status"] = "Delivered"
            truth = _defect("status", "invalid_value")
        elif v == 1:
            for j in rng.sample(range(n), 2):
                rows[j]["currency"] = "EUR"
            truth = _defect("currency", "wrong_currency")
        elif v == 2:
            rows[i]["order_date"] = "2026-08-31"
            truth = _defect("order_date", "out_of_window")
        else:
            rows[i]["status"] = "shipped "
            truth = _defect("status", "invalid_value")
        b.add_orders(rows, truth)
    elif family == "legit-edge":
        if v == 0:
            i = b.pick(rows)
            rows[i]["status"] = "refunded"
            rows[i]["amount"] = "-%.2f" % rng.uniform(20, 400)
            b.add_orders(rows)
            b.add_orders(b.clean_orders())
        elif v == 1:
            i = b.pick(rows)
            rows[i]["amount"] = "50000.00"
            j = b.pick(rows)
            rows[j]["order_date"] = "2026-09-30"
            b.add_orders(rows)
            b.add_orders(b.clean_orders())
        else:
            b.new_customers_with_orders(rows)
            if v == 3:
                rows[b.pick(rows)]["status"] = "returned"
            b.add_orders(rows)
    else:
        raise ValueError(f"unknown family {family!r}; families: {list(FAMILIES)}")
    if family not in ("clean-control", "legit-edge"):
        b.add_orders(b.clean_orders())


def generate_case(case_id: str, family: str, variant: int, seed: int, contract: dict) -> dict:
    """One case, drawn from `seed` exactly as the classic suite draws it."""
    b = _CaseBuilder(seed)
    b.warehouse()
    tag = "0930-%d" % b.rng.randint(10, 99)
    _family_body(b, family, variant)
    if (family, variant) in (("legit-edge", 2), ("clean-control", 3)):
        b.batches.sort(key=lambda batch: batch["table"] != "orders")
    else:
        b.rng.shuffle(b.batches)
    for k, batch in enumerate(b.batches, 1):
        batch["batch_id"] = f"B-{tag}-{k}"
    n = len(b.batches)
    return {
        "batches": b.batches, "case_id": case_id, "contract": copy.deepcopy(contract),
        "family": family, "variant": variant, "seed": seed,
        "prompt": PROMPT.format(n=n, es="es" if n > 1 else ""),
        "warehouse": {"customers": b.wh_customers, "orders": b.wh_orders},
    }


def eval_cases(contract: dict) -> list[dict]:
    return [generate_case(f"eval-{family}-{v}", family, v, EVAL_BASE_SEED + 100 * fi + v, contract)
            for fi, family in enumerate(FAMILIES) for v in range(4)]


def train_cases(contract: dict) -> list[dict]:
    return [generate_case("train-%03d" % k, family, variant, seed, contract)
            for k, family, variant, seed in procedural_draws(TRAIN_SEED, TRAIN_CASES, FAMILIES)]


def generate(out_dir: str | Path, contracts_dir: str | Path | None = None, rows: int | None = None,
             splits: tuple[str, ...] = ("eval", "train")) -> list[Path]:
    """Write the classic suite's two files; returns their paths. Its sizes are fixed, and it is written whole."""
    if rows is not None:
        raise ValueError("the classic suite's batch sizes are fixed: it takes no --rows")
    if tuple(splits) != ("eval", "train"):
        raise ValueError("the classic suite is written whole (both splits)")
    contract = load_contract("classic", contracts_dir)
    out_dir = Path(out_dir)
    return [write_cases(out_dir / "eval_curated.jsonl", eval_cases(contract)),
            write_cases(out_dir / "train_procedural.jsonl", train_cases(contract))]
