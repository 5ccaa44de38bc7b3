"""A third suite, defined entirely here, to show that adding a suite needs no edit outside its folder.

"mini": one table of meter readings, one defect (a blank reading), one family, six tools (the
kernel's seven without profile_batch). It is registered the way any outside suite is: its module
named in GATE_SUITES (`mini_suite:SUITE`, with tests/ on the path), or `suites.register(SUITE)`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from gate_pipeline.kernel.cases import fail, write_cases
from gate_pipeline.kernel.contract import ContractError, Rule
from gate_pipeline.kernel.episode import Episode
from gate_pipeline.kernel.grading import Judgement, LedgerFold, Rubric
from gate_pipeline.kernel.sandbox import Sandbox
from gate_pipeline.kernel.suite import Arg, Suite, Tool
from gate_pipeline.kernel.world import BatchFindings, PreparedCase, World, connect

NAME = "mini"
COLUMNS = {"readings": ("reading_id", "meter", "value")}
DEFECT_TYPES = ("missing_value",)
FAMILY = "blank-reading"
CONTRACT = {"readings": {"value": "a reading's value is a number, never blank (else missing_value)"},
            "defect_types": ["missing_value"]}
RULE = Rule("readings", "value", "missing_value")
MART_SQL = "SELECT COALESCE(SUM(CAST(value AS REAL)), 0) FROM wh_readings"


def validate_contract(doc, where: str = "contract") -> dict:
    if doc != CONTRACT:
        raise ContractError(f"{where}: a mini contract is exactly {json.dumps(CONTRACT)}")
    return doc


def check_case(case: dict, where: str) -> None:
    pass


def check_batch(batch: dict, where: str) -> None:
    rows = batch["rows"]
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 3 and all(isinstance(v, str) for v in r)
                                             for r in rows):
        raise fail(where, "'rows' must be a list of [reading_id, meter, value] strings")


class MiniPrepared(PreparedCase):
    def __init__(self, case):
        super().__init__(case)
        conn = connect()
        conn.execute("CREATE TABLE wh_readings (reading_id TEXT, meter TEXT, value TEXT)")
        for bid, batch in self.batches.items():
            conn.execute(f"CREATE TABLE {self.staging[bid]} (reading_id TEXT, meter TEXT, value TEXT)")
            conn.executemany(f"INSERT INTO {self.staging[bid]} VALUES (?, ?, ?)", batch.data["rows"])
        self.image = conn.serialize()
        conn.close()

    def row_count(self, batch_id: str) -> int:
        return len(self.batches[batch_id].data["rows"])

    def preview(self, batch_id: str, n: int):
        return list(COLUMNS["readings"]), [list(r) for r in self.batches[batch_id].data["rows"][:n]]

    def warehouse_rows(self) -> dict[str, int]:
        return {"readings": 0}

    @property
    def correct_mart(self) -> float:
        return round(sum(float(r[2]) for b in self.batches.values() if not b.defective for r in b.data["rows"]), 2)

    @property
    def gold_rows(self) -> list[tuple]:
        return [tuple(r) for b in self.batches.values() if b.defective for r in b.data["rows"] if not r[2].strip()]


class MiniWorld(World):
    def __init__(self, prepared: MiniPrepared, listener=None, deferred_ledger: bool = False):
        conn = connect()
        conn.deserialize(prepared.image)
        super().__init__(prepared, conn, Sandbox(conn), listener, deferred_ledger)

    def orphan_rows(self, batch_id: str) -> int:
        return 0

    def load(self, batch_id: str) -> int:
        rows = self.prepared.batches[batch_id].data["rows"]
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT INTO wh_readings VALUES (?, ?, ?)", rows)
        self.conn.execute("COMMIT")
        return len(rows)



class MiniEpisode(Episode):
    world_class = MiniWorld


BATCH_ID = Arg("batch_id", "str", "a batch id as list_batches gives it")
TOOLS = (
    Tool("read_contract", "Return the data contract."),
    Tool("list_batches", "List tonight's batches."),
    Tool("run_sql", "One read-only SELECT.", (Arg("query", "str", "one SELECT", limit=None),), shaped="QUERY"),
    Tool("load_batch", "Load a batch (cannot be undone).", (BATCH_ID,), shaped=None),
    Tool("quarantine_batch", "Keep a batch out, citing a column and a defect type.",
         (BATCH_ID, Arg("column", "str", "the column"), Arg("defect_type", "str", "the defect", enum="defect_types")),
         shaped=None),
    Tool("submit_report", "Report what you loaded and quarantined.",
         (Arg("loaded", "strlist", "loaded ids"), Arg("quarantined", "strlist", "quarantined ids")), shaped=None),
)


class MiniRubric(Rubric):
    def judge(self, case, state: LedgerFold) -> Judgement:
        right = sum((state.loads.get(b.batch_id, 0) == 0 and b.batch_id in state.quarantined) if b.defective
                    else state.loads.get(b.batch_id, 0) == 1 for b in case.batches)
        bad = [b for b in case.batches if b.defective]
        cited = sum(1 for b in bad if state.quarantined.get(b.batch_id, {}).get("defect_type") == "missing_value"
                    and not state.loads.get(b.batch_id))
        return Judgement(disposition=right / len(case.batches), evidence=cited / len(bad) if bad else 1.0,
                         inspected=state.inspected,
                         bad_batches_loaded=sum(1 for b in bad if state.loads.get(b.batch_id)),
                         clean_batches_refused=sum(1 for b in case.batches
                                                   if not b.defective and b.batch_id in state.quarantined))


def make_case(k: int) -> dict:
    rng = random.Random(k)
    batches = []
    for j in range(2):
        rows = [[f"R{k}{j}{i}", f"M{rng.randint(1, 9)}", f"{rng.uniform(1, 99):.2f}"] for i in range(5)]
        defective = (k + j) % 2 == 0
        if defective:
            rows[rng.randrange(5)][2] = " "
        batches.append({"batch_id": f"MB-{k}-{j}", "table": "readings", "source": "meter feed", "rows": rows,
                        "truth": {"defective": defective,
                                  "defects": [{"column": "value", "type": "missing_value"}] if defective else []}})
    return {"case_id": f"mini-{k}", "family": FAMILY, "suite": NAME, "prompt": "Load tonight's meter readings.",
            "contract": CONTRACT, "batches": batches}


def generate(out_dir, contracts_dir=None, rows=None, splits=("eval", "train")) -> list[Path]:
    out = Path(out_dir)
    files = {"eval": ("eval_curated.jsonl", range(4)), "train": ("train_procedural.jsonl", range(4, 12))}
    return [write_cases(out / files[s][0], [make_case(k) for k in files[s][1]]) for s in splits]


def findings(prepared) -> list[BatchFindings]:
    out = []
    for bid, batch in prepared.batches.items():
        blank = [(RULE, i, "value", r[2]) for i, r in enumerate(batch.data["rows"]) if not r[2].strip()]
        out.append(BatchFindings(bid, batch.table, len(batch.data["rows"]), [RULE] if blank else [], blank))
    return out


class MiniCareful:
    """Reads the contract, counts blank readings in each batch by SQL, quarantines or loads, reports."""
    name, oracle = "mini-careful", False

    def play(self, tools, case=None) -> None:
        tools("read_contract")
        loaded, quarantined = [], []
        for b in tools("list_batches"):
            blanks = tools("run_sql", query=f"SELECT COUNT(*) FROM {b['staging_table']} WHERE TRIM(value) = ''")
            if blanks["rows"][0][0]:
                tools("quarantine_batch", batch_id=b["batch_id"], column="value", defect_type="missing_value")
                quarantined.append(b["batch_id"])
            else:
                tools("load_batch", batch_id=b["batch_id"])
                loaded.append(b["batch_id"])
        tools("submit_report", loaded=loaded, quarantined=quarantined)


SUITE = Suite(
    name=NAME, description="a third suite for tests: blank meter readings", families=(FAMILY,), columns=COLUMNS,
    defect_types=DEFECT_TYPES, tools=TOOLS, prepared_case=MiniPrepared, episode=MiniEpisode, rubric=MiniRubric(),
    case_keys=("batches", "case_id", "contract", "family", "prompt", "suite"),
    batch_keys=("batch_id", "rows", "source", "table", "truth"), check_case=check_case, check_batch=check_batch,
    validate_contract=validate_contract, generate=generate, findings=findings,
    prompt="You load meter readings. Quarantine a batch with a blank reading; load the rest; report.",
    agents={"mini-careful": "mini_suite:MiniCareful"}, report_agents=("naive", "mini-careful", "refuse-all"),
    attack_agents=("mini-careful", "report-liar"), target="mini-careful", key_columns={"readings": "reading_id"},
    mart_sql=MART_SQL,
)
