"""A small agent for gate: checks one rule (the amount range) and loads everything else.

    gate report --agents naive,my_agent:AmountCheck      (with examples/ on PYTHONPATH)
"""

AMOUNT_OUT_OF_RANGE = ("SELECT 1 FROM {t} WHERE (status <> 'refunded' AND CAST(amount AS REAL) <= 0) "
                       "OR CAST(amount AS REAL) > 50000")


class AmountCheck:
    def play(self, tools, case=None):
        loaded, quarantined = [], []
        for batch in sorted(tools("list_batches"), key=lambda b: b["table"] != "customers"):
            bid = batch["batch_id"]
            query = AMOUNT_OUT_OF_RANGE.format(t=batch["staging_table"])
            if batch["table"] == "orders" and tools("run_sql", query=query)["rows"]:
                tools("quarantine_batch", batch_id=bid, column="amount", defect_type="out_of_range")
                quarantined.append(bid)
            else:
                tools("load_batch", batch_id=bid)
                loaded.append(bid)
        tools("submit_report", loaded=loaded, quarantined=quarantined)
