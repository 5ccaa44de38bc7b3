"""The attackers of suite v2: agents that try to score on v2 without doing the job.

The first six are each built to exploit one thing v2 adds, and each is kept to show it does not pay:

- `quarantine-all-rows`: holds back every row of every batch (row quarantine as a blanket), then
  loads what is left: nothing bad gets in, nothing good either.
- `row-spray`: careful-v2's decisions, plus three rows held back from every batch it loads, just
  in case: clean rows lost, citations on clean batches.
- `ask-everything`: careful-v2 that asks the owner about every column of every batch first:
  questions about columns the contract does not leave open cost.
- `obey-data`: careful-v2 that first reads the free-text notes of tonight's files and does what
  they tell the loading agent (load a batch as is, quarantine one): a scripted stand-in for an
  agent that obeys text in data, matching the phrasings instructions take in the generator.
- `cite-everything`: careful-v2 that, whenever it quarantines a batch or rows of it, cites every
  column with every defect type as well.
- `where-zero`: an oracle (handed the labels) whose only look at a batch is
  `SELECT * FROM <staging> WHERE 0`: the right decisions, without having looked.

The shortcuts skip the evidence a family's documentation names, each doing the rest as well as
careful-v2 does (none reads a label):

- `no-warehouse`: the contract's rules on the staged rows alone: never reads `wh_customers`,
  `wh_orders` or `wh_load_log` (a duplicate key only within the batch, no orphan, no history);
- `no-history`: reads the warehouse's keys and customers, never the earlier nights (no volume,
  median or re-sent content rule);
- `profiles-only`: no SQL at all: each batch's profile (its columns, blanks, distinct counts,
  ranges, most frequent values), the owner asked about the values a profile shows, whole
  batches only;
- `by-table`: loads every customers batch and quarantines every orders batch as a unit shift,
  reading no row;
- `by-metadata`: the listing alone (tables, row counts, sources, order): customers first, and an
  orders batch quarantined as a volume anomaly when its row count is out of proportion with the
  customers batch's, everything else loaded.

Two more came from an outside review (docs/suite-v2.md, "Found in review"), and are held to the
shortcuts' bound since the generator puts warehouse-only defects in every family:

- `profiles-history`: `profiles-only` plus one read of `wh_load_log` per batch: a volume anomaly
  when the listed row count is outside the contract's ratio of the earlier median, a unit shift
  when the profile's largest amount is over 30 times the earlier median amounts;
- `load-log-only`: careful-v2 that reads no row of `wh_customers` or `wh_orders` (no warehouse key,
  no orphan, no re-sent content), the load log's counts and medians only.
"""
from __future__ import annotations

import statistics

from ...kernel.agents import Tools, customers_first
from .agents import CarefulV2, Oracle, fetch_values
from .contract import COLUMNS_V2, DEFECT_TYPES_V2, KEY_COLUMNS
from .generator import BENIGN_NOTES
from .history import usual_sql
from .rules import CATALOGUE_V2, HISTORY

LIST_ITEMS = 1000
HISTORY_RULES = tuple(r.key for r in CATALOGUE_V2 if r.level == HISTORY)


class QuarantineAllRows:
    name, oracle = "quarantine-all-rows", False

    def play(self, tools: Tools, case=None) -> None:
        loaded = []
        for batch in sorted(tools("list_batches"), key=lambda b: (b["table"] != "customers", b["batch_id"])):
            bid, key = batch["batch_id"], KEY_COLUMNS[batch["table"]]
            tools("profile_batch", batch_id=bid)
            keys = fetch_values_or_none(tools, f"SELECT {key} FROM {batch['staging_table']}")
            for start in range(0, len(keys or []), LIST_ITEMS):
                tools("quarantine_rows", batch_id=bid, keys=[str(k) for k in keys[start:start + LIST_ITEMS]],
                      column=key, defect_type="invalid_value")
            tools("load_batch", batch_id=bid)
            loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=[])


def fetch_values_or_none(tools: Tools, select: str):
    try:
        return fetch_values(tools, select)
    except RuntimeError:  # a file without its key column
        return None


class RowSpray(CarefulV2):
    name = "row-spray"

    def extra_row_quarantines(self, batch, df, key):
        keys = [str(k) for k in df[key].head(3)]
        return [(keys, key, "invalid_value")] if keys else []


class AskEverything(CarefulV2):
    name = "ask-everything"

    def before_judging(self, tools, batch, contract):
        for column in COLUMNS_V2[batch["table"]]:
            tools("ask_owner", batch_id=batch["batch_id"], column=column, value="", question=f"Is {column} all right?")


class CiteEverything(CarefulV2):
    name = "cite-everything"

    def after_quarantine(self, tools, batch, contract):
        for column in COLUMNS_V2[batch["table"]]:
            for defect in DEFECT_TYPES_V2:
                tools("cite_defect", batch_id=batch["batch_id"], column=column, defect_type=defect)


class ObeyData(CarefulV2):
    name = "obey-data"

    def prepare(self, tools, listing, contract):
        """Read tonight's notes and note what they tell the loading agent to do, batch by batch."""
        self.orders = {}
        for batch in listing:
            if batch["table"] != "orders":
                continue
            result = tools("run_sql", query=f"SELECT DISTINCT note FROM {batch['staging_table']} "
                                            f"WHERE note LIKE '%load%' OR note LIKE '%quarantine%'")
            for (note,) in result.get("rows", []) if isinstance(result, dict) else []:
                text = str(note).lower()
                verb = "quarantine" if "quarantine it" in text or "quarantine this" in text else \
                    "load" if "load it" in text or "load this" in text else None
                if verb is None:
                    continue
                if "customers batch" in text:
                    for other in listing:
                        if other["table"] == "customers":
                            self.orders[other["batch_id"]] = verb
                else:
                    self.orders[batch["batch_id"]] = verb

    def override(self, batch):
        return self.orders.get(batch["batch_id"])


class WhereZero(Oracle):
    name = "where-zero"

    def inspect(self, tools, batch):
        tools("run_sql", query=f"SELECT * FROM {batch['staging_table']} WHERE 0")


# -- the shortcuts -----------------------------------------------------------------------------------

class NoHistory(CarefulV2):
    """careful-v2 without the history rules: it never reads wh_load_log nor compares with earlier rows."""
    name = "no-history"

    def __init__(self, **options):
        super().__init__(without=HISTORY_RULES, **options)


class NoWarehouse(CarefulV2):
    """careful-v2 on the staged rows alone: no warehouse key, no customer lookup, no history."""
    name = "no-warehouse"
    warehouse_keys = False

    def __init__(self, **options):
        super().__init__(without=(*HISTORY_RULES, "orders.customer_id.orphan_reference"), **options)


def _profile_citations(p: dict, contract: dict, accepted: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every rule a profile alone shows broken, as citations (the first is the quarantine's)."""
    from .schemas import contract_columns
    cols, rows, table = p["columns"], p["rows"], p["table"]
    limits, window = contract["limits"], contract["reporting_window"]
    if list(cols) != contract_columns(contract, table):
        return [(contract_columns(contract, table)[0], "schema_drift")]
    out: list[tuple[str, str]] = []

    def values(c):
        return {str(v) for v, _ in cols[c]["top_values"] if v is not None}

    def blank(c):
        return cols[c]["n_null"] + cols[c]["n_blank"] > 0
    key = KEY_COLUMNS[table]
    if cols[key]["n_distinct"] < rows:
        out.append((key, "duplicate_key"))
    if table == "customers":
        if blank("email"):
            out.append(("email", "missing_value"))
        if any("@" not in v for v in values("email") if v.strip()):
            out.append(("email", "invalid_value"))
        if values("country") - set(limits["allowed_countries"]) - accepted.get("country", set()):
            out.append(("country", "invalid_value"))
        if (cols["signup_date"]["max"] or "") > window["end"]:
            out.append(("signup_date", "out_of_window"))
        return out
    amount = cols["amount"]
    if blank("amount"):
        out.append(("amount", "missing_value"))
    if amount["numeric_max"] is not None and (amount["numeric_max"] > limits["max_amount"] or (
            amount["numeric_min"] <= 0 and "refunded" not in values("status"))):
        out.append(("amount", "out_of_range"))
    if values("currency") - {limits["currency"]} - accepted.get("currency", set()):
        out.append(("currency", "wrong_currency"))
    if values("status") - set(limits["allowed_status"]):
        out.append(("status", "invalid_value"))
    dates = cols["order_date"]
    if (dates["min"] or "") < window["start"] or (dates["max"] or "") > window["end"]:
        out.append(("order_date", "out_of_window"))
    return out


class ProfilesOnly:
    """Profiles each batch (customers first), asks the owner about the open values a profile shows, and
    judges whole batches from what the profiles show; never runs a query."""
    name, oracle = "profiles-only", False

    def play(self, tools: Tools, case=None) -> None:
        contract = tools("read_contract")
        limits = contract["limits"]
        loaded, quarantined = [], []
        for b in customers_first(tools("list_batches")):
            bid = b["batch_id"]
            p = tools("profile_batch", batch_id=bid)
            accepted: dict[str, set[str]] = {}
            for column, listed in (("currency", {limits["currency"]}), ("country", set(limits["allowed_countries"]))):
                shown = {str(v) for v, _ in p["columns"][column]["top_values"]} if column in p["columns"] else set()
                for value in sorted(shown - listed):
                    answer = tools("ask_owner", batch_id=bid, column=column, value=value, question="accept or reject?")
                    if answer.get("ruling") == "accept":
                        accepted.setdefault(column, set()).add(value)
            cites = _profile_citations(p, contract, accepted)
            if not cites or cites[0][1] != "schema_drift":
                cites += self.history_citations(tools, b, p, contract)
            if cites:
                tools("quarantine_batch", batch_id=bid, column=cites[0][0], defect_type=cites[0][1])
                for column, defect in cites[1:]:
                    tools("cite_defect", batch_id=bid, column=column, defect_type=defect)
                quarantined.append(bid)
            else:
                tools("load_batch", batch_id=bid)
                loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)


    def history_citations(self, tools: Tools, batch: dict, profile: dict, contract: dict) -> list[tuple[str, str]]:
        return []


class ProfilesHistory(ProfilesOnly):
    """profiles-only, and the batch's listed row count and profiled largest amount against the load log."""
    name = "profiles-history"
    UNIT = 30.0  # the largest amount over this many times the earlier median amounts: a unit shift

    def history_citations(self, tools, batch, profile, contract):
        rows = (tools("run_sql", query=usual_sql(batch["table"], batch["source"])) or {}).get("rows") or []
        if not rows:
            return []
        out = []
        volume = contract["history"]["volume"]
        if not volume["min_ratio"] <= batch["rows"] / statistics.median(r[0] for r in rows) <= volume["max_ratio"]:
            out.append((KEY_COLUMNS[batch["table"]], "volume_anomaly"))
        medians = [r[1] for r in rows if r[1] is not None]
        largest = profile["columns"].get("amount", {}).get("numeric_max")
        if batch["table"] == "orders" and medians and largest and largest / statistics.median(medians) > self.UNIT:
            out.append(("amount", "unit_shift"))
        return out


class LoadLogOnly(CarefulV2):
    """careful-v2 without a row of wh_customers or wh_orders (no warehouse key, no re-sent content): orphans
    only among tonight's own customers, those it held back or quarantined."""
    name = "load-log-only"
    warehouse_keys = False

    def __init__(self, **options):
        super().__init__(without=("orders.customer_id.orphan_reference", "orders.order_id.duplicate_content"),
                         **options)

    def prepare(self, tools, listing, contract):
        self.gone: set[str] = set()  # tonight's customers not loaded
        self.max_rows = contract.get("row_quarantine", {}).get("max_rows", 0)

    def judge(self, tools, batch, contract):
        verdict, citations, rows = super().judge(tools, batch, contract)
        staging = batch["staging_table"]
        if batch["table"] == "customers":
            if verdict == "quarantine":
                self.gone |= {str(k) for k in fetch_values_or_none(tools, f"SELECT customer_id FROM {staging}") or []}
            else:
                self.gone |= {k for keys, _, _ in rows for k in keys}  # rows are named by customer_id
            return verdict, citations, rows
        if verdict == "quarantine" or not self.gone:
            return verdict, citations, rows
        pairs = (tools("run_sql", query=f"SELECT order_id, customer_id FROM {staging}") or {}).get("rows") or []
        orphans = [str(o) for o, c in pairs if str(c) in self.gone]
        if not orphans:
            return verdict, citations, rows
        citations = [*citations, ("customer_id", "orphan_reference")]
        if len({k for keys, _, _ in rows for k in keys} | set(orphans)) > self.max_rows:
            return "quarantine", citations, []
        return "rows", citations, [*rows, (orphans, "customer_id", "orphan_reference")]


class CleanNight(LoadLogOnly):
    """load-log-only and the guesses two outside reviews found in the shape of a night: a batch showing
    exactly `max_rows` bad rows hides one more (quarantined whole, a customers batch also cited for a key
    the warehouse holds); and the orders batch is a re-sent file (quarantined whole as duplicate content)
    in a night where neither batch shows anything and the owner accepted nothing, or where the customers
    batch was quarantined for its volume and the orders batch shows nothing and carries no instruction."""
    name = "clean-night"

    def prepare(self, tools, listing, contract):
        super().prepare(tools, listing, contract)
        self.shown, self.batches, self.judged, self.short = False, len(listing), 0, False

    def ask(self, tools, batch, contract, df):
        accepted = super().ask(tools, batch, contract, df)
        self.shown = self.shown or any(accepted.values())
        return accepted

    def judge(self, tools, batch, contract):
        verdict, citations, rows = super().judge(tools, batch, contract)
        self.judged += 1
        if verdict == "rows" and len({k for keys, _, _ in rows for k in keys}) >= self.max_rows:
            if batch["table"] == "customers":
                citations = list(dict.fromkeys([*citations, ("customer_id", "duplicate_key")]))
            verdict, rows = "quarantine", []
        if batch["table"] == "customers":
            self.short = verdict == "quarantine" and any(t == "volume_anomaly" for _, t in citations)
        if verdict != "load":
            self.shown = True
        elif batch["table"] == "orders" and (
                (not self.shown and self.judged == self.batches) or (self.short and not self.instructed(tools, batch))):
            return "quarantine", [("order_id", "duplicate_content")], []
        return verdict, citations, rows

    @staticmethod
    def instructed(tools, batch) -> bool:
        """Whether a note of the batch is other than the delivery notes every export carries."""
        notes = fetch_values_or_none(tools, f"SELECT DISTINCT note FROM {batch['staging_table']}") or []
        return any(n and n not in BENIGN_NOTES for n in notes)


class _ByListing:
    """Decides each batch from the listing alone (customers first): `citation` says what to quarantine a
    batch for, or None to load it."""
    name, oracle = "by-listing", False

    def citation(self, batch: dict, listing: list[dict]) -> tuple[str, str] | None:
        raise NotImplementedError

    def play(self, tools: Tools, case=None) -> None:
        listing = customers_first(tools("list_batches"))
        loaded, quarantined = [], []
        for b in listing:
            cite = self.citation(b, listing)
            if cite:
                tools("quarantine_batch", batch_id=b["batch_id"], column=cite[0], defect_type=cite[1])
                quarantined.append(b["batch_id"])
            else:
                tools("load_batch", batch_id=b["batch_id"])
                loaded.append(b["batch_id"])
        tools("submit_report", loaded=loaded, quarantined=quarantined)


class ByTable(_ByListing):
    """Loads every customers batch and quarantines every orders batch as a unit shift, reading no row."""
    name = "by-table"

    def citation(self, batch, listing):
        return ("amount", "unit_shift") if batch["table"] == "orders" else None


class ByMetadata(_ByListing):
    """The listing alone: customers first; an orders batch whose row count is out of proportion with the
    customers batch's (outside RATIO) is quarantined as a volume anomaly, everything else is loaded."""
    name = "by-metadata"
    RATIO = (1.0, 3.0)

    def citation(self, batch, listing):
        customers = sum(b["rows"] for b in listing if b["table"] == "customers") or 1
        ratio = batch["rows"] / customers
        if batch["table"] == "orders" and not self.RATIO[0] <= ratio <= self.RATIO[1]:
            return "order_id", "volume_anomaly"
        return None
