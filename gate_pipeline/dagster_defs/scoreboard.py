"""The nightly benchmark as one asset: every case of a case file x the configured agents.

`scoreboard` is a graph asset: `plan_nightly` splits the cases into chunks (one step each,
so Dagster's executors can spread them over processes or machines), `play_chunk` plays
each chunk's episodes in plain Python through the tool bridge, storing every warehouse and
ledger, and `build_scoreboard` grades the stored runs (stored warehouse + ledger + truth)
and renders exactly the tables `gate report` prints, as markdown and JSON, with the history
of past nights so a regression shows.
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from ..agents import AgentOptionError, UnknownAgent, resolve_agent
from ..cases import CaseError, read_cases, split_of
from ..engine import play_cases
from ..grader import grade_stored
from ..store import StoreSink
from ..tables import baseline_tables, summary
from .bridge import ToolBridge
from .markdown import md_code, md_table
from .partitions import cases_partitions
from .resources import CaseLibrary, GateStore

NIGHTLY_GROUP = "gate_nightly"
DEFAULT_AGENTS = ["naive", "careful", "refuse-all"]
HISTORY_NIGHTS = 14


class NightlyConfig(dg.Config):
    cases_file: str = Field(default="", description="the case file to benchmark (JSONL); empty: the classic "
                                                    "eval split in the case library")
    agents: list[str] = Field(default_factory=lambda: list(DEFAULT_AGENTS), description="agent names")
    agent_options: dict = Field(default_factory=dict, description="{agent name: {option: value}}")
    chunk_size: int = Field(default=8, description="cases per step")
    log_reads: bool = Field(default=False, description="log every SQL read as a debug event")


def _cases(path: str) -> list[dict]:
    try:
        return read_cases(path)
    except (CaseError, OSError) as exc:
        raise dg.Failure(description=f"nightly cases file: {exc}") from None


def _specs(chunk: dict, case_library: CaseLibrary) -> list:
    contracts = case_library.settings().contracts_dir
    try:
        return [resolve_agent(name, chunk["agent_options"].get(name), contracts=contracts) for name in chunk["agents"]]
    except (UnknownAgent, AgentOptionError) as exc:
        raise dg.Failure(description=f"nightly: {exc}") from None


@dg.op(out=dg.DynamicOut(dict), description="Check the agents, add missing case partitions, split into chunks.")
def plan_nightly(context: dg.OpExecutionContext, config: NightlyConfig, case_library: CaseLibrary):
    if not config.agents:
        raise dg.Failure(description="nightly: configure at least one agent")
    if config.chunk_size < 1:
        raise dg.Failure(description=f"nightly: chunk_size must be at least 1, not {config.chunk_size}")
    for name, options in config.agent_options.items():
        if not isinstance(options, dict):
            raise dg.Failure(description=f"nightly: agent_options[{name!r}] must be a mapping")
    cases_file = config.cases_file or str(case_library.settings().cases_file("eval"))
    plan = {"cases_file": cases_file, "agents": list(config.agents), "agent_options": dict(config.agent_options),
            "log_reads": config.log_reads}
    _specs(plan, case_library)  # every agent checked before anything is played
    cases = _cases(cases_file)
    if not cases:
        raise dg.Failure(description=f"nightly: {cases_file} holds no cases")
    keys = [c["case_id"] for c in cases]
    known = set(context.instance.get_dynamic_partitions(cases_partitions.name))
    missing = [k for k in keys if k not in known]
    if missing:
        context.instance.add_dynamic_partitions(cases_partitions.name, missing)
    for start in range(0, len(cases), config.chunk_size):
        indices = list(range(start, min(start + config.chunk_size, len(cases))))
        yield dg.DynamicOutput({**plan, "indices": indices}, mapping_key=f"cases_{start:04d}")


@dg.op(description="Play a chunk of cases x agents through the engine; every episode is stored and bridged.")
def play_chunk(context: dg.OpExecutionContext, chunk: dict, gate_store: GateStore, case_library: CaseLibrary) -> dict:
    cases = _cases(chunk["cases_file"])
    specs = _specs(chunk, case_library)
    store = gate_store.open()
    try:
        results = play_cases([cases[i] for i in chunk["indices"]], specs, run_id=context.run.run_id,
                             sinks=(StoreSink(store), ToolBridge(context, log_reads=chunk["log_reads"])))
    finally:
        store.dispose()
    played = [{"index": index, "agent": agent, "episode_id": rs[k].episode_id}
              for agent, rs in results.items() for k, index in enumerate(chunk["indices"])]
    return {"cases_file": chunk["cases_file"], "played": played}


def _history(nights: list[dict], agents: list[str]) -> str:
    rows = [[n["night"], n["run_id"] or "", n["summary"].get("cases_file", ""),
             *(f"{n['summary']['agents'][a]['reward']:.4f}" if a in n["summary"]["agents"] else "-" for a in agents)]
            for n in nights]
    return md_table(["night", "run", "cases", *agents], rows)


def regressions(previous: dict | None, current: dict) -> list[str]:
    """Agents whose mean reward fell since the previous night on the same case file."""
    if not previous or previous.get("cases_file") != current.get("cases_file"):
        return []
    return [f"{a}: {previous['agents'][a]['reward']:.4f} -> {s['reward']:.4f}"
            for a, s in current["agents"].items()
            if a in previous["agents"] and s["reward"] < previous["agents"][a]["reward"]]


def _write_page(path: Path, grades: dict, tables: str, night) -> Path:
    """The scoreboard as the self-contained HTML page (charts and tables) beside the run store."""
    from ..html_report import write_html
    return write_html(path, grades, title="gate nightly scoreboard",
                      subtitle=f"night {night}: {', '.join(grades)}", tables=[("Tables", tables)])


@dg.op(description="Grade the stored episodes and render the report tables, with history.")
def build_scoreboard(context: dg.OpExecutionContext, parts: list, gate_store: GateStore):
    played = [p for part in parts for p in part["played"]]
    if not played:
        raise dg.Failure(description="nightly: nothing was played")
    store = gate_store.open()
    try:
        agents = list(dict.fromkeys(p["agent"] for p in played))
        cases_file = parts[0]["cases_file"]
        cases = _cases(cases_file)
        grades: dict[str, list] = {a: [None] * len(cases) for a in agents}
        for p in played:  # from the stored warehouse and ledger, as the grading sensor grades them
            grades[p["agent"]][p["index"]] = grade_stored(store.load(p["episode_id"]))
        figures = summary(cases, grades)
        figures["cases_file"] = cases_file
        text = baseline_tables(cases, grades, split=split_of(Path(cases_file)))
        previous = store.nightly_history(1)
        fell = regressions(previous[0]["summary"] if previous else None, figures)
        night = store.add_nightly(figures, context.run.run_id)
        history = store.nightly_history(HISTORY_NIGHTS)
        page = _write_page(store.home / "scoreboard.html", grades, text, night)
    finally:
        store.dispose()
    for line in fell:
        context.log.warning(f"regression since the previous night: {line}")
    return dg.Output({"summary": figures, "tables": text,
                      "grades": {a: [g.as_dict() for g in gs] for a, gs in grades.items()}, "regressions": fell},
                     metadata={
        "tables": dg.MetadataValue.md(md_code(text)),
        "summary": dg.MetadataValue.json(figures),
        "history": dg.MetadataValue.md(_history(history, agents)),
        "regressions": dg.MetadataValue.json(fell),
        "html": dg.MetadataValue.path(str(page)),
        "episodes": len(played),
        **{f"reward/{a}": figures["agents"][a]["reward"] for a in agents},
    })


@dg.graph_asset(group_name=NIGHTLY_GROUP, kinds={"python"},
                description="The nightly benchmark: the tables `gate report` prints, as markdown and JSON, "
                            "with the history of past nights.")
def scoreboard():
    return build_scoreboard(plan_nightly().map(play_chunk).collect())
