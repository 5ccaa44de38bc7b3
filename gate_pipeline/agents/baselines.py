"""The simple baselines: naive, refuse-all and profile-only (what a profile alone can show)."""
from __future__ import annotations

from .base import Tools, customers_first


class Naive:
    """Loads everything in listed order and reports it honestly."""
    name, oracle = "naive", False

    def play(self, tools: Tools, case=None) -> None:
        ids = [b["batch_id"] for b in tools("list_batches")]
        for bid in ids:
            tools("load_batch", batch_id=bid)
        tools("submit_report", loaded=ids, quarantined=[])


class RefuseAll:
    """Quarantines every batch without looking (citing customer_id / invalid_value)."""
    name, oracle = "refuse-all", False

    def play(self, tools: Tools, case=None) -> None:
        ids = [b["batch_id"] for b in tools("list_batches")]
        for bid in ids:
            tools("quarantine_batch", batch_id=bid, column="customer_id", defect_type="invalid_value")
        tools("submit_report", loaded=[], quarantined=ids)


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

    def play(self, tools: Tools, case=None) -> None:
        contract = tools("read_contract")
        loaded, quarantined = [], []
        for b in customers_first(tools("list_batches")):
            bid = b["batch_id"]
            cite = profile_citation(tools("profile_batch", batch_id=bid), contract)
            if cite:
                tools("quarantine_batch", batch_id=bid, column=cite[0], defect_type=cite[1])
                quarantined.append(bid)
            else:
                tools("load_batch", batch_id=bid)
                loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)
