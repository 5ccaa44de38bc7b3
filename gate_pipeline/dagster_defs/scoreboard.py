"""The nightly benchmark as one asset: every case of a case file x the configured agents.

`scoreboard` is a graph asset downstream of every case's `agent_report`: `plan_nightly` splits
the cases into chunks (one step each, so Dagster's executors can spread them over processes or
machines), `play_chunk` plays each chunk's episodes in plain Python through the engine, storing
every warehouse and ledger (the tool bridge records loads, quarantines and reports as
observations: the nightly materializes only the scoreboard) and handing on each episode's grade,
computed once as the episode ended, and `build_scoreboard` renders from those grades exactly the
tables `gate report` prints, as markdown and JSON, with the history of past nights so a
regression shows. `chunk_size` 0 (the default) picks the chunk size from the case count.

Step outputs go to the run store's database (resources.StepOutputs), so the chunks may run on
other machines (`nightly_benchmark_celery`) that share only that database.

Re-executing a failed nightly from failure works: `build_scoreboard` gets the plan from
`plan_nightly` and plays, itself, the chunks that did not run in this run or its parent (a
re-execution from failure skips steps that never started), so the scoreboard is complete.

Every night is sealed: `plan_nightly` records in the run store, before anything is played, the
episodes the night must produce (its cases, agents, the case file's hash, the gate version), and
`build_scoreboard` seals it as complete with the episodes its scoreboard counts (a re-execution's
episodes count for the run it re-executes); `gate verify` checks the store against both. The
agents a run's config may name are the ones the code location lists (`catalog.AgentName`).
"""

import hashlib
from pathlib import Path

import dagster as dg
from pydantic import Field

from ..html_report import PageProcess, write_html
from ..kernel.agents import AgentOptionError, UnknownAgent, resolve_agents
from ..kernel.cases import Case, CaseError, cases_of_text, read_case_text, split_of, suite_of_cases
from ..kernel.engine import play_cases
from ..kernel.errors import RepeatedAgent
from ..kernel.records import Grade
from ..store import COMPLETE, NIGHTLY, StoreError, StoreSink, manifest_body, process_name
from ..tables import baseline_tables, summary
from .bridge import ToolBridge
from .catalog import CODE_VERSION, OWNERS, AgentName
from .markdown import md_code, md_table
from .partitions import cases_partitions
from .resources import STEP_OUTPUTS, CaseLibrary, GateStore

NIGHTLY_GROUP = "gate_nightly"
HISTORY_NIGHTS = 14


class NightlyConfig(dg.Config):
    cases_file: str = Field(default="", description="the case file to benchmark (JSONL); empty: the default "
                                                    "suite's eval split in the case library")
    agents: list[AgentName] = Field(default_factory=list, description="agents, of those this code location "
                                                                      "lists (empty: the case file's suite's "
                                                                      "baselines, naive, careful, refuse-all for "
                                                                      "the classic suite)")
    agent_options: dict = Field(default_factory=dict, description="{agent name: {option: value}}")
    chunk_size: int = Field(default=0, description="cases per step (0: from the case count, "
                                                    "chunk_size_for)")
    log_reads: bool = Field(default=False, description="log every SQL read as a debug event")


SCOREBOARD = "scoreboard"  # the asset: observed once per chunk as the night plays, materialized at its end
LISTED = 12  # the case numbers a chunk's observation lists when they are not a run
MIN_CHUNK, AUTO_STEPS = 8, 8  # chunk_size 0: at least MIN_CHUNK cases a step, at most AUTO_STEPS steps or so

# the case file this process read last, with its text: every step of a night reads the same file, and
# checking its cases is most of the cost of reading it; a file whose text changed is checked again
_READ: dict[str, tuple[str, str, list[Case]]] = {}
_PAGES: list[PageProcess] = []  # draw_pages_in


def chunk_size_for(cases: int) -> int:
    """The chunk size of `chunk_size` 0: few steps (each costs Dagster's bookkeeping), still several for
    the executors that spread them over processes or machines, and never fewer than MIN_CHUNK cases."""
    return max(MIN_CHUNK, -(-cases // AUTO_STEPS))


def remember_cases(path: str, text: str, cases: list[Case]) -> None:
    """The cases checked from a case file's text, for the night's steps in this process (`gate nightly`
    checks its file before Dagster starts: its plan does not check it again)."""
    _remember(path, text, _sha256(text), cases)


def _remember(path: str, text: str, digest: str, cases: list[Case]) -> None:
    _READ.clear()  # one file is enough: a night reads one
    _READ[str(Path(path).absolute())] = (text, digest, cases)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read(path: str, sha: str | None = None) -> tuple[list[Case], str]:
    """The cases of the file at `path` and the SHA-256 of its text; with `sha` (the SHA-256 it had when the night
    was planned), a Failure if the file has changed since: a night never plays or scores the cases of two files."""
    try:
        text = read_case_text(path)
        known = _READ.get(str(Path(path).absolute()))
        if known is not None and known[0] == text:  # the text this process checked: its digest and cases with it
            digest, cases = known[1], known[2]
        else:
            digest, cases = _sha256(text), None
        if sha is not None and digest != sha:
            raise dg.Failure(description=f"nightly cases file: {path} changed while the night played (its "
                                         "SHA-256 is not the one it had when the night was planned); run it again")
        if cases is None:
            cases = cases_of_text(text, str(Path(path)))
            _remember(path, text, digest, cases)
        return cases, digest
    except (CaseError, OSError) as exc:
        raise dg.Failure(description=f"nightly cases file: {exc}") from None


def _cases(path: str, sha: str | None = None) -> list[Case]:
    return _read(path, sha)[0]


def _specs(chunk: dict, case_library: CaseLibrary) -> list:
    contracts = case_library.settings().contracts_dir
    try:
        return resolve_agents(chunk["agents"], chunk["agent_options"], contracts=contracts)
    except (UnknownAgent, AgentOptionError, RepeatedAgent) as exc:
        raise dg.Failure(description=f"nightly: {exc}") from None


@dg.op(ins={"after": dg.In(dg.Nothing)},
       out={"chunks": dg.DynamicOut(dict, io_manager_key=STEP_OUTPUTS), "plan": dg.Out(dict, io_manager_key=STEP_OUTPUTS)},
       description="Check the agents, add missing case partitions, split into chunks.")
def plan_nightly(context: dg.OpExecutionContext, config: NightlyConfig, case_library: CaseLibrary,
                 gate_store: GateStore):
    if config.chunk_size < 0:
        raise dg.Failure(description=f"nightly: chunk_size must be at least 1 (or 0: from the case count), "
                                     f"not {config.chunk_size}")
    for name, options in config.agent_options.items():
        if not isinstance(options, dict):
            raise dg.Failure(description=f"nightly: agent_options[{name!r}] must be a mapping")
    # absolute: the manifest and the summary name the file wherever `gate verify` runs from
    cases_file = str(Path(config.cases_file or case_library.settings().cases_file("eval")).absolute())
    cases, digest = _read(cases_file)
    try:
        agents = [a.value for a in config.agents] or list(suite_of_cases(cases).report_agents)
    except CaseError as exc:
        raise dg.Failure(description=f"nightly cases file: {exc}") from None
    plan = {"cases_file": cases_file, "cases_sha256": digest, "agents": agents,
            "agent_options": dict(config.agent_options), "log_reads": config.log_reads}
    specs = _specs(plan, case_library)  # every agent and its options checked before anything is played
    who = "gate nightly" if context.run.tags.get("gate/trigger") == "cli" else f"the Dagster run {context.run.run_id}"
    store = gate_store.open()
    try:  # sealed before anything is played: what the night must produce
        _refuse_a_completed_night(context, store)
        store.seal_run(context.run.run_id, NIGHTLY, manifest_body(cases, cases_file, specs, 1, process_name(who)))
    finally:
        store.dispose()
    keys = [c.case_id for c in cases]
    known = set(context.instance.get_dynamic_partitions(cases_partitions.name))
    missing = [k for k in keys if k not in known]
    if missing:
        context.instance.add_dynamic_partitions(cases_partitions.name, missing)
    context.instance.add_run_tags(context.run.run_id, {"gate/cases": Path(cases_file).name[:255],
                                                       "gate/agents": ",".join(agents)[:255]})
    size = config.chunk_size or chunk_size_for(len(cases))
    for start in range(0, len(cases), size):
        indices = list(range(start, min(start + size, len(cases))))
        yield dg.DynamicOutput({**plan, "indices": indices}, output_name="chunks", mapping_key=f"cases_{start:04d}")
    yield dg.Output({**plan, "cases": len(cases)}, output_name="plan")


def _root(context) -> str:
    """The run a re-execution re-executes (its manifest is the night's), else the run itself."""
    return context.run.root_run_id or context.run.run_id


def _refuse_a_completed_night(context, store) -> None:
    """A re-execution of a night that completed ("Re-execute all" of a night that succeeded) would play it again as a
    continuation of it that never completes, and keep a second summary of it: a Failure, before anything is played."""
    root = _root(context)
    manifest = store.manifest(root) if root != context.run.run_id else None
    if manifest is not None and manifest["status"] == COMPLETE:
        raise dg.Failure(description=f"nightly: night {root} completed; a completed night is not played again "
                                     "(launch the nightly job anew for another night)")


def _played(indices: list[int], cases: int, agents: int) -> str:
    """What a chunk's observation says it played: `cases 41-80 of 320 x 3 agents`, or the cases' numbers."""
    numbers = [i + 1 for i in indices]
    run = numbers == list(range(numbers[0], numbers[-1] + 1)) if numbers else False
    which = f"cases {numbers[0]}-{numbers[-1]}" if run and len(numbers) > 1 else \
        f"case{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers[:LISTED]))}" + \
        (f" and {len(numbers) - LISTED} more" if len(numbers) > LISTED else "")
    return f"{which} of {cases} x {agents} agent{'s' if agents > 1 else ''}"


def _play(context, chunk: dict, gate_store: GateStore, case_library: CaseLibrary) -> list[dict]:
    cases = _cases(chunk["cases_file"], chunk.get("cases_sha256"))  # (a plan of an older gate has none)
    specs = _specs(chunk, case_library)
    store = gate_store.open(once=True)
    # every episode stored as it opens, with those that ended before it in the same transaction (the
    # chunk's last at the end); one observation of the scoreboard for the chunk's episodes
    keep = StoreSink(store, batch=len(chunk["indices"]) * len(specs))
    bridge = ToolBridge(context, log_reads=chunk["log_reads"], chunk_asset=SCOREBOARD)
    try:
        store.continue_run(context.run.run_id, _root(context))
        with store.holding():
            try:
                results = play_cases([cases[i] for i in chunk["indices"]], specs, run_id=context.run.run_id,
                                     sinks=(keep, bridge))
            finally:
                keep.flush()  # an interrupted chunk's episodes too (the one cut off ends abandoned)
        bridge.flush(_played(chunk["indices"], len(cases), len(specs)))
    finally:
        store.dispose()
    return [{"index": index, "agent": agent, "episode_id": rs[k].episode_id, "grade": rs[k].grade.as_dict()}
            for agent, rs in results.items() for k, index in enumerate(chunk["indices"])]


@dg.op(out=dg.Out(dict, io_manager_key=STEP_OUTPUTS),
       description="Play a chunk of cases x agents through the engine; every episode is stored and bridged.")
def play_chunk(context: dg.OpExecutionContext, chunk: dict, gate_store: GateStore, case_library: CaseLibrary) -> dict:
    return {"cases_file": chunk["cases_file"], "played": _play(context, chunk, gate_store, case_library)}


def short_cases(path: str) -> str:
    """A case file as a table names it: its folder (the suite) and its name, `classic/eval_curated.jsonl`."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def short_run(run_id: str | None) -> str:
    """A run id as Dagster's UI shows it (its first 8 characters), linking to the run's page."""
    return f"[{run_id[:8]}](/runs/{run_id})" if run_id else ""


def _history(nights: list[dict], agents: list[str]) -> str:
    """Each night's mean reward per agent first, then the case file and the run (short, so the rewards fit)."""
    rows = [[n["night"],
             *(f"{n['summary']['agents'][a]['reward']:.4f}" if a in n["summary"]["agents"] else "-" for a in agents),
             short_cases(n["summary"].get("cases_file", "")), short_run(n["run_id"])]
            for n in nights]
    return md_table(["night", *agents, "cases", "run"], rows)


def regressions(previous: dict | None, current: dict) -> list[str]:
    """Agents whose mean reward fell since the previous night on the same case file."""
    if not previous or previous.get("cases_file") != current.get("cases_file"):
        return []
    return [f"{a}: {previous['agents'][a]['reward']:.4f} -> {s['reward']:.4f}"
            for a, s in current["agents"].items()
            if a in previous["agents"] and s["reward"] < previous["agents"][a]["reward"]]


def draw_pages_in(pages: PageProcess | None) -> None:
    """The process that draws the scoreboard's page for the nights this process plays (`gate nightly`
    starts one before Dagster loads, and waits for its pages when the night is done); None: drawn here."""
    _PAGES[:] = [pages] if pages is not None else []


def _write_page(path: Path, grades: dict, tables: str, night, figures: dict) -> Path:
    """The scoreboard as the self-contained HTML page (charts and tables) beside the run store."""
    write = _PAGES[0].write_html if _PAGES else write_html
    return write(path, grades, title="gate nightly scoreboard", subtitle=f"night {night}: {', '.join(grades)}",
                 tables=[("Tables", tables)], figures=figures, replace=True)  # whatever is there, replaced whole


@dg.op(out=dg.Out(io_manager_key=STEP_OUTPUTS),
       description="Collect the grades of the stored episodes and render the report tables, with history.")
def build_scoreboard(context: dg.OpExecutionContext, parts: list, plan: dict, gate_store: GateStore,
                     case_library: CaseLibrary):
    store = gate_store.open(once=True)
    try:
        _refuse_a_completed_night(context, store)  # before anything is played here
        played = [p for part in parts for p in part["played"]]
        agents = [spec.identity for spec in _specs(plan, case_library)]
        have = {(p["index"], p["agent"]) for p in played}
        missing = sorted({i for i in range(plan["cases"]) for a in agents if (i, a) not in have})
        if missing:  # chunks that never ran (a re-execution from failure skips steps that never started)
            context.log.warning(f"{len(missing)} cases were not played by any chunk of this run: playing them here")
            played += _play(context, {**plan, "indices": missing}, gate_store, case_library)
        cases_file = plan["cases_file"]
        cases = _cases(cases_file, plan.get("cases_sha256"))
        grades: dict[str, list] = {a: [None] * len(cases) for a in agents}
        for p in played:  # graded once, as each episode ended (a step output is read only if its seal holds)
            grades[p["agent"]][p["index"]] = Grade.from_dict(p["grade"])
        figures = summary(cases, grades)  # made once: the tables and the page show these figures too
        text = baseline_tables(cases, grades, split=split_of(Path(cases_file)), figures=figures)
        figures["cases_file"] = cases_file
        previous = store.nightly_history(1)
        fell = regressions(previous[0]["summary"] if previous else None, figures)
        store.continue_run(context.run.run_id, _root(context))
        try:
            night = store.complete_night(_root(context), [(cases[p["index"]].case_id, p["agent"], 0, p["episode_id"])
                                                          for p in played], figures, context.run.run_id)
        except StoreError as exc:
            raise dg.Failure(description=f"nightly: {exc}") from None
        history = store.nightly_history(HISTORY_NIGHTS)
        page = _write_page(store.home / "scoreboard.html", grades, text, night, figures)
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


@dg.graph_asset(group_name=NIGHTLY_GROUP, kinds={"python"}, owners=OWNERS, code_version=CODE_VERSION,
                tags={"layer": "benchmark"},
                ins={"agent_report": dg.AssetIn(partition_mapping=dg.AllPartitionMapping(), dagster_type=dg.Nothing)},
                description="The nightly benchmark: every case of a case file x the configured agents, every "
                            "episode stored and graded once as it ended; the tables `gate report` prints, as markdown and JSON, with the "
                            "history of past nights. Stale after a day (the schedule runs it at 02:00 UTC).")
def scoreboard(agent_report):
    chunks, plan = plan_nightly(agent_report)
    return build_scoreboard(chunks.map(play_chunk).collect(), plan)
