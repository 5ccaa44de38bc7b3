"""The classic suite's agents: the careful baselines, and profile-only (what a profile alone can show).

`careful` validates each batch with the pandera schemas built from the contract it read
(rows and warehouse keys fetched through `run_sql`, validated lazily, the first failing rule
cited). `careful-sql` applies the same rules as one SQL check each. Both load customers
first, quarantine with the defect found, and report what they did.
"""
from __future__ import annotations

from ...kernel.agents import Tools, customers_first
from ...kernel.contract import rule_keys_option
from .contract import COLUMNS
from .rules import CATALOGUE, rules_for

PAGE = 50


def _sql_list(values) -> str:
    return ",".join("'" + str(v).replace("'", "''") + "'" for v in values)


def sql_checks(table: str, stg: str, contract: dict) -> list[tuple[str, str, str]]:
    """(column, defect type, query that returns a row per violation), in rule order."""
    limits, window = contract["limits"], contract["reporting_window"]
    cap = limits["max_amount"]
    if table == "customers":
        return [
            ("customer_id", "duplicate_key",
             f"SELECT customer_id FROM {stg} GROUP BY customer_id HAVING COUNT(*) > 1 UNION "
             f"SELECT s.customer_id FROM {stg} s JOIN wh_customers w ON s.customer_id = w.customer_id"),
            ("email", "missing_value", f"SELECT 1 FROM {stg} WHERE email IS NULL OR TRIM(email) = ''"),
            ("country", "invalid_value",
             f"SELECT 1 FROM {stg} WHERE country IS NULL OR country NOT IN ({_sql_list(limits['allowed_countries'])})"),
            ("signup_date", "out_of_window", f"SELECT 1 FROM {stg} WHERE signup_date > '{window['end']}'"),
        ]
    return [
        ("order_id", "duplicate_key",
         f"SELECT order_id FROM {stg} GROUP BY order_id HAVING COUNT(*) > 1 UNION "
         f"SELECT s.order_id FROM {stg} s JOIN wh_orders w ON s.order_id = w.order_id"),
        ("amount", "missing_value", f"SELECT 1 FROM {stg} WHERE amount IS NULL OR TRIM(amount) = ''"),
        ("amount", "out_of_range",
         f"SELECT 1 FROM {stg} WHERE (status = 'refunded' AND (CAST(amount AS REAL) >= 0 OR "
         f"CAST(amount AS REAL) < -{cap})) OR (status <> 'refunded' AND (CAST(amount AS REAL) <= 0 OR "
         f"CAST(amount AS REAL) > {cap}))"),
        ("currency", "wrong_currency", f"SELECT 1 FROM {stg} WHERE currency IS NULL OR currency <> '{limits['currency']}'"),
        ("status", "invalid_value",
         f"SELECT 1 FROM {stg} WHERE status IS NULL OR status NOT IN ({_sql_list(limits['allowed_status'])})"),
        ("order_date", "out_of_window",
         f"SELECT 1 FROM {stg} WHERE order_date < '{window['start']}' OR order_date > '{window['end']}'"),
        ("customer_id", "orphan_reference",
         f"SELECT 1 FROM {stg} WHERE customer_id NOT IN (SELECT customer_id FROM wh_customers)"),
    ]


def fetch_all(tools: Tools, select: str) -> list[list]:
    """Every row of `select`, fifty at a time (run_sql returns at most 50 rows)."""
    rows, offset = [], 0
    while True:
        result = tools("run_sql", query=f"{select} LIMIT {PAGE} OFFSET {offset}")
        if "error" in result:
            raise RuntimeError(f"careful: query failed: {result['error']}")
        rows.extend(result["rows"])
        if len(result["rows"]) < PAGE:
            return rows
        offset += PAGE


def rule_keys(value) -> tuple[str, ...]:
    """The `without` option: a list of rule keys (rules.CATALOGUE); anything else is a ValueError."""
    return rule_keys_option(value, (r.key for r in CATALOGUE))


class _Careful:
    """Shared loop: contract, listing, customers first, check, load or quarantine, report."""
    name, oracle = "careful", False

    def __init__(self, order=customers_first, loads_per_clean: int = 1):
        self.order = order
        self.loads_per_clean = loads_per_clean

    def find_defect(self, tools: Tools, batch: dict, contract: dict) -> tuple[str, str] | None:
        raise NotImplementedError

    def play(self, tools: Tools, case=None) -> None:
        contract = tools("read_contract")
        loaded, quarantined = [], []
        for batch in self.order(tools("list_batches")):
            bid = batch["batch_id"]
            defect = self.find_defect(tools, batch, contract)
            if defect:
                tools("quarantine_batch", batch_id=bid, column=defect[0], defect_type=defect[1])
                quarantined.append(bid)
            else:
                for _ in range(self.loads_per_clean):
                    tools("load_batch", batch_id=bid)
                loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)


class CarefulSQL(_Careful):
    """The contract as SQL: one query per rule, the first that returns a row is cited."""
    name = "careful-sql"

    def find_defect(self, tools, batch, contract):
        for column, defect, query in sql_checks(batch["table"], batch["staging_table"], contract):
            result = tools("run_sql", query=query)
            if "error" not in result and result["rows"]:
                return column, defect
        return None


class CarefulPandera(_Careful):
    """The pandera schemas built from the contract, validated lazily on each fetched batch."""
    name = "careful"

    def __init__(self, without=(), contract_view=None, order=customers_first, loads_per_clean: int = 1):
        super().__init__(order=order, loads_per_clean=loads_per_clean)
        self.without = rule_keys(without)
        self.contract_view = contract_view  # contract read -> contract the schema is built from (variants)

    def find_defect(self, tools, batch, contract):
        if self.contract_view is not None:
            contract = self.contract_view(contract)
        table = batch["table"]
        cols = COLUMNS[table]
        rows = fetch_all(tools, f"SELECT {', '.join(cols)} FROM {batch['staging_table']}")
        rules = rules_for(contract, table, self.without)
        keys: dict[str, set] = {}
        if any(r.needs_warehouse for r in rules):
            keys["customer_id"] = {r[0] for r in fetch_all(tools, "SELECT customer_id FROM wh_customers")}
            if table == "orders":
                keys["order_id"] = {r[0] for r in fetch_all(tools, "SELECT order_id FROM wh_orders")}
        from .schemas import build_schema, failing_rules, frame  # pandas + pandera: only when used
        schema = build_schema(contract, table, keys, self.without)
        failed, _ = failing_rules(schema, frame(rows, cols), rules)
        return (failed[0].column, failed[0].defect_type) if failed else None


def profile_citation(p: dict, contract: dict) -> tuple[str, str] | None:
    """The first rule a profile alone shows broken, or None. It cannot see the warehouse."""
    cols, rows = p["columns"], p["rows"]
    limits, window = contract["limits"], contract["reporting_window"]

    def blank(c):
        return cols[c]["n_null"] + cols[c]["n_blank"] > 0

    def values(c):
        return {v for v, _ in cols[c]["top_values"]}

    if p["table"] == "customers":
        if cols["customer_id"]["n_distinct"] < rows:
            return "customer_id", "duplicate_key"
        if blank("email"):
            return "email", "missing_value"
        if values("country") - set(limits["allowed_countries"]):
            return "country", "invalid_value"
        if (cols["signup_date"]["max"] or "") > window["end"]:
            return "signup_date", "out_of_window"
        return None
    if cols["order_id"]["n_distinct"] < rows:
        return "order_id", "duplicate_key"
    if blank("amount"):
        return "amount", "missing_value"
    amount = cols["amount"]
    if amount["numeric_max"] is not None and (
            amount["numeric_max"] > limits["max_amount"]
            or (amount["numeric_min"] <= 0 and "refunded" not in values("status"))):
        return "amount", "out_of_range"
    if values("currency") - {limits["currency"]}:
        return "currency", "wrong_currency"
    if values("status") - set(limits["allowed_status"]):
        return "status", "invalid_value"
    dates = cols["order_date"]
    if (dates["min"] or "") < window["start"] or (dates["max"] or "") > window["end"]:
        return "order_date", "out_of_window"
    return None


class ProfileOnly:
    """Profiles each batch (customers first) and applies what a profile shows; never queries."""
    name, oracle = "profile-only", False

    def citation(self, tools: Tools, batch: dict, listing: list[dict], contract: dict) -> tuple[str, str] | None:
        """The batch's citation, or None to load it."""
        return profile_citation(tools("profile_batch", batch_id=batch["batch_id"]), contract)

    def play(self, tools: Tools, case=None) -> None:
        contract = tools("read_contract")
        loaded, quarantined = [], []
        listing = customers_first(tools("list_batches"))
        for b in listing:
            bid = b["batch_id"]
            cite = self.citation(tools, b, listing, contract)
            if cite:
                tools("quarantine_batch", batch_id=bid, column=cite[0], defect_type=cite[1])
                quarantined.append(bid)
            else:
                tools("load_batch", batch_id=bid)
                loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)
