"""The contract owner of a v2 case: what `ask_owner` answers, from the case's rulings.

The owner rules on a column's value, never on a batch: a case file's `owner` lists a ruling for each
value of the generator's vocabulary the contract leaves open (some accepted, the others rejected,
drawn alike in every family), and the answer to a question about a value is the same whichever batch
the question names. An agent learns from the owner what a value it saw means, not whether a batch
holds one (which only its rows show).
"""
from __future__ import annotations

RULED_COLUMNS = ("currency", "country")  # the columns the owner rules on; for any other the contract stands
REJECT_AS = {"currency": "wrong_currency", "country": "invalid_value"}
LISTED = {"currency": lambda limits: [limits["currency"]], "country": lambda limits: limits["allowed_countries"],
          "status": lambda limits: limits["allowed_status"]}  # the values the contract lists, per column
NO_RULING = "The contract owner has nothing to add about {column}: the contract stands."
IS_LISTED = "The contract lists {value!r} for {column}: no ruling is needed, the contract allows it."
# what the owner says of a value (the case files carry it; a value no ruling names is rejected in the same words)
ACCEPT = {
    "currency": "{value!r} is how the new checkout writes US dollars: accept these rows as USD.",
    "country": "{value} is a market since 2026-10-01 (the contract predates the launch): accept these rows.",
}
REJECT = {
    "currency": "{value!r} rows come from the sandbox checkout (test orders, not revenue): reject these rows as "
                "currency / wrong_currency.",
    "country": "{value} is not a market we sell in: reject these rows as country / invalid_value.",
}
REJECT_FOREIGN = ("{value!r} amounts are not US dollars and the mart sums amounts without conversion: reject these "
                  "rows as currency / wrong_currency.")
REJECT_NOT_ISO = "{value!r} is not an ISO-2 country code: reject these rows as country / invalid_value."


def answer_text(column: str, value: str, accept: bool) -> str:
    """The owner's words on a value of a ruled column: by what the value looks like (a spelling of US dollars or
    another currency, an ISO-2 code or not), never by whether the generator draws it."""
    if accept:
        return ACCEPT[column].format(value=value)
    if column == "currency" and value.upper().rstrip("$") not in ("USD", "US"):
        return REJECT_FOREIGN.format(value=value)
    if column == "country" and not (len(value) == 2 and value.isupper()):
        return REJECT_NOT_ISO.format(value=value)
    return REJECT[column].format(value=value)


class Owner:
    """A case's rulings, by column and value."""

    def __init__(self, rulings: list[dict], contract: dict):
        self.rulings = {(r["column"], r["value"]): r for r in rulings}
        self.limits = contract["limits"]

    def accepted(self) -> dict[str, set[str]]:
        """The values the owner accepts, per column."""
        out: dict[str, set[str]] = {}
        for (column, value), r in self.rulings.items():
            if r["ruling"] == "accept":
                out.setdefault(column, set()).add(value)
        return out

    def answer(self, column: str, value: str) -> dict:
        """The owner's answer about `value` in `column`: its ruling (accept, reject, or none when the
        contract settles it: a listed value, a column the owner does not rule on), the defect type a
        rejected value is cited as, and the owner's words."""
        if column not in RULED_COLUMNS:
            return {"ruling": "none", "answer": NO_RULING.format(column=column)}
        if value in LISTED[column](self.limits):
            return {"ruling": "none", "answer": IS_LISTED.format(column=column, value=value)}
        r = self.rulings.get((column, value))
        if r is None:  # the contract stands: the value is rejected, in the words a ruled rejection has
            return {"ruling": "reject", "defect_type": REJECT_AS[column], "answer": answer_text(column, value, False)}
        return {k: r[k] for k in ("ruling", "defect_type", "answer") if k in r}
