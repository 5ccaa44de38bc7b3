"""`gate cases export`: the cases as a Hugging Face dataset, and model transcripts as chat SFT data.

    gate cases export --format hf OUT                     # every suite, both splits: OUT/<suite>/<split>.parquet
    gate cases export --format jsonl-chat OUT --run runs/RUN_ID [--run ...] [--min-reward 1.0]

`hf` writes one parquet file per suite and split (with `datasets`, `pip install 'gate-pipeline[hf]'`)
and a dataset card (`OUT/README.md`) whose `configs` name them, so `datasets.load_dataset(OUT, SUITE)`
gives both splits. A row is one case as `gate run` poses it: `prompt` (the chat messages: the suite's
system prompt and the opening), `system_prompt`, `tools` (the chat-completions tool schemas as JSON
text), `case_id` (what the trainer adapters' `reset` takes), `suite`, `family`, `split`, `task` (the
case's own description) and `batches`. No truth label is in a row.

`jsonl-chat` writes one line per rollout of the named runs: `messages` (the conversation as sent, tool
calls and tool results included), `tools` (as recorded in the run's tools.json), `case_id`, `reward`,
`run_id`, `key`. Which rollouts go out is decided by the run store, never by the transcript: each
episode is graded again from its stored ledger and warehouse (as `gate verify` does); a line whose
episode is missing or does not check is left out and counted, and so is one below `--min-reward`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..kernel.files import path_state, read_text
from ..kernel.settings import Settings
from ..kernel.suite import suites
from .common import output_file
from .errors import UsageError

FORMATS = ("hf", "jsonl-chat")
SPLITS = ("train", "eval")


def case_rows(settings: Settings, suite_name: str, split: str) -> list[dict]:
    """One row per case of a suite's split, as a model is given it (no labels)."""
    from ..kernel.cases import read_cases
    from ..model_agent.prompt import opening_messages
    from ..model_agent.tool_schemas import tool_schemas
    suite = suites.get(suite_name)
    path = settings.cases_file(split, suite_name)
    tools = json.dumps(tool_schemas(suite))
    return [{"case_id": c.case_id, "suite": c.suite, "family": c.family, "split": split,
             "prompt": opening_messages(suite), "system_prompt": suite.prompt, "tools": tools,
             "task": c.prompt, "batches": len(c.batches)} for c in read_cases(path)]


def _card(written: dict[str, list[tuple[str, Path]]], out: Path) -> str:
    lines = ["---", "configs:"]
    for suite_name, files in written.items():
        lines += [f"- config_name: {suite_name}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {path.relative_to(out).as_posix()}" for split, path in files]
    lines += ["---", "", "# gate cases", "",
              "Written by `gate cases export --format hf`: one row per case as `gate run` poses it "
              "(system prompt, opening, tool schemas, case id); no truth labels.", ""]
    return "\n".join(lines)


def export_hf(settings: Settings, out: Path, suite_names: list[str]) -> list[Path]:
    try:
        import datasets
    except ImportError:
        raise UsageError("--format hf needs the datasets package: pip install 'gate-pipeline[hf]'") from None
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # the command prints the files it wrote, nothing else
    try:
        return _write_hf(datasets.Dataset, settings, out, suite_names)
    finally:
        if bars:
            datasets.enable_progress_bars()


def _write_hf(Dataset, settings: Settings, out: Path, suite_names: list[str]) -> list[Path]:
    written: dict[str, list[tuple[str, Path]]] = {}
    paths = []
    wanted = [(name, split) for name in suite_names for split in SPLITS
              if path_state(settings.cases_file(split, name)) == "file"]
    # before anything is written: what is there already must be what this command wrote there (a FIFO was waited
    # on for ever; a README.md of someone else's, or a link to a file outside, was overwritten)
    for path, starts in [*((out / name / f"{split}.parquet", b"PAR1") for name, split in wanted),
                         (out / "README.md", b"---\nconfigs:")]:
        if path_state(path) != "missing" or os.path.islink(path):
            output_file("", path, starts)
    for name, split in wanted:
        rows = case_rows(settings, name, split)
        path = out / name / f"{split}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        Dataset.from_list(rows).to_parquet(str(path))
        written.setdefault(name, []).append((split, path))
        paths.append(path)
    if not paths:
        raise UsageError(f"no case files of {', '.join(suite_names)} under {settings.cases_dir}")
    (out / "README.md").write_text(_card(written, out), encoding="utf-8")
    return paths


TOOLS_LIMIT = 16 * 2**20  # a run's tools.json: the tools schema and prompt of each suite (a few KB as gate writes it)


def export_chat(settings: Settings, out: Path, runs: list[str], min_reward: float) -> tuple[int, dict[str, int]]:
    """(lines written, lines left out by why) for the transcripts of `runs`."""
    from ..model_agent.rollouts import TOOLS, TRANSCRIPTS, read_transcripts
    from ..store import RunStore
    from ..verify import verify_store
    left: dict[str, int] = {"below --min-reward": 0, "not in the run store": 0, "does not check": 0}
    written = 0
    for run in runs:  # before anything is written
        if not (Path(run) / TRANSCRIPTS).is_file():
            raise UsageError(f"--run {run}: no {TRANSCRIPTS} there (a gate run directory holds one)")
        if out.exists() and os.path.samefile(out, Path(run) / TRANSCRIPTS):
            raise UsageError(f"{out}: is what --run {run} reads; give another name")
    # written beside it and put in its place once whole: a failure leaves what was there as it was
    direct = out.exists() and not out.is_file()  # /dev/null (output_file lets nothing else through)
    fd, temp = (None, str(out)) if direct else tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    store = RunStore(settings)
    try:
        with (open(out, "w", encoding="utf-8") if fd is None else os.fdopen(fd, "w", encoding="utf-8")) as fh:
            for run in runs:
                run_dir = Path(run)
                try:  # only a regular file, read up to a limit: a FIFO there was waited on for ever, /dev/zero read
                    recorded = json.loads(read_text(run_dir / TOOLS, "tools file", TOOLS_LIMIT, UsageError))
                except (UsageError, ValueError, RecursionError):  # until the process was killed
                    recorded = {}
                checked = verify_store(store, run_dir.name)
                fresh = checked.fresh
                broken = {p.episode_id for p in checked.problems}
                for line in read_transcripts(run_dir / TRANSCRIPTS):
                    eid = line.get("episode_id")
                    if eid not in fresh:
                        left["not in the run store"] += 1
                    elif eid in broken:
                        left["does not check"] += 1
                    elif fresh[eid].reward < min_reward:
                        left["below --min-reward"] += 1
                    else:
                        fh.write(json.dumps(_chat_line(line, fresh[eid].reward, recorded), default=str) + "\n")
                        written += 1
        if not direct:
            os.replace(temp, out)
    finally:
        store.dispose()
        if not direct and os.path.exists(temp):
            os.unlink(temp)
    return written, left


def _chat_line(line: dict, reward: float, recorded: dict) -> dict:
    from ..model_agent.tool_schemas import tool_schemas
    suite_name = line.get("grade", {}).get("suite") if isinstance(line.get("grade"), dict) else None
    suite_name = suite_name if suite_name in suites.names() else suites.default().name
    tools = (recorded.get(suite_name) or {}).get("tools") if isinstance(recorded, dict) else None
    return {"messages": line.get("messages", []), "tools": tools or tool_schemas(suites.get(suite_name)),
            "case_id": line.get("case_id"), "reward": reward, "run_id": line.get("run_id"), "key": line.get("key")}


def cmd_cases_export(a, settings: Settings) -> int:
    out = Path(a.out)
    if a.format == "hf":
        if a.run:
            raise UsageError("--run goes with --format jsonl-chat (transcripts); --format hf exports the cases")
        names = [suites.get(a.suite).name] if a.suite else suites.names()
        if path_state(out) not in ("missing", "directory"):
            raise UsageError(f"{out} exists and is not a directory (--format hf writes a folder)")
        try:
            paths = export_hf(settings, out, names)
        except OSError as exc:
            raise UsageError(f"{out}: cannot write there ({exc.strerror or exc})") from None
        for p in paths:
            print(p)
        return 0
    if not a.run:
        raise UsageError("--format jsonl-chat exports transcripts: name a run directory with --run runs/RUN_ID")
    out = output_file("", out, b'{"messages"')  # one conversation a line, as _chat_line writes it
    try:
        written, left = export_chat(settings, out, a.run, a.min_reward)
    except OSError as exc:
        raise UsageError(f"{out}: cannot write there ({exc.strerror or exc})") from None
    skipped = ", ".join(f"{n} {why}" for why, n in left.items() if n)
    print(f"{out}: {written} conversations" + (f" ({skipped} left out)" if skipped else ""))
    return 0


def _reward(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--min-reward must be a number, not {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise UsageError(f"--min-reward must be from 0 to 1, not {value}")
    return value


def register(csub) -> None:
    """`gate cases export`, under `gate cases` (cli/cases.py)."""
    p = csub.add_parser("export", help="the cases as a Hugging Face dataset, or transcripts as chat SFT data",
                        description="The cases as a Hugging Face dataset (hf), or model transcripts as chat SFT data "
                                    "(jsonl-chat).",
                        epilog="examples:\n  gate cases export --format hf /tmp/gate-hf\n"
                               "  gate cases export --format jsonl-chat /tmp/sft.jsonl --run runs/coin-demo")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="hf: the cases, parquet per suite and split; jsonl-chat: transcripts, one conversation a line")
    p.add_argument("out", metavar="OUT", help="the folder (hf) or file (jsonl-chat) to write")
    p.add_argument("--suite", default=None, help="hf: only this suite (default: every registered suite)")
    p.add_argument("--run", action="append", default=None, metavar="RUN_DIR",
                   help="jsonl-chat: a gate run directory (repeat for more)")
    p.add_argument("--min-reward", type=_reward, default=0.0,
                   help="jsonl-chat: only rollouts the store grades at least this (1.0: the passes)")
    p.set_defaults(fn=cmd_cases_export)
