"""Case files: JSON lines, read and written exactly, and the typed `Case` every part of gate hands around.

A case is read once, at the boundary (`read_cases`, `load_case`), checked there, and from then on
is a frozen `Case`: its id, family, suite, prompt, contract and batches as attributes, and the JSON
object it was read from (`data`), which `dumps_case` writes back byte for byte. What every suite's
cases share is checked here (the keys the suite names, ids, tables, texts, staging names that
cannot collide); the rest by the case's suite (`Suite.check_case`, `check_batch`, `check_rest`),
and a bad case is refused with the file, the line and what is wrong, never later with a traceback.
"""
from __future__ import annotations

import bisect
import json
import marshal
import random
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from .contract import ContractError
from .errors import GateError
from .files import json_lines, read_text
from .suite import Suite, UnknownSuite, suites

MAX_ID_CHARS = 200  # a case id or batch id (tools refuse longer arguments)
MAX_CASE_FILE_BYTES = 4 * 2**30  # a case file is read whole: at most this (a v2 file of 32 cases at ~300,000 rows)
MAX_VALUE_CHARS = 20_000  # a cell or a text (the sandbox's string length limit)
_NOT_IDENT = re.compile(r"[^a-z0-9_]")

def printable(text) -> str:
    """`text` as a line of gate's output may show it: every character Python does not call printable
    (`str.isprintable`: controls, line and paragraph separators, invisible format characters such as the
    bidirectional overrides, zero-width and tag characters, private-use, unassigned and surrogate code
    points, every space but the space itself) written as an escape. So a stored id or name that holds a
    newline cannot forge a line of its own, nor one that holds a right-to-left override show other text than
    it holds; and an id gate refuses (`bad_id`) is one that this would change."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def valid_text(text: str) -> str:
    """`text` with each lone surrogate (a code point UTF-8 cannot encode, which JSON's "\\ud800" escape or an
    undecodable byte of a command-line argument makes) replaced by U+FFFD, the replacement character, so it
    can be stored and sent; a surrogate pair stands for its character. Any other text is returned as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def bad_id(value) -> bool:
    """Whether a case or batch id is unusable: not text, empty, too long, not valid Unicode or unprintable."""
    return (not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or bad_text(value) is not None
            or not value.isprintable())


class CaseError(GateError, ValueError):
    """A case file or case object that gate cannot use."""


def fail(where: str, msg: str) -> CaseError:
    return CaseError(f"{where}: {msg}")


def staging_table(batch_id: str) -> str:
    """The staging table a batch waits in: `stg_` and its id, lower-case, other characters as `_`."""
    return "stg_" + _NOT_IDENT.sub("_", batch_id.lower())


def bounded_name(name) -> str:
    """A name from a case file as a message quotes it: repr, cut at 80 characters."""
    text = repr(name)
    return text if len(text) <= 80 else f"{text[:80]}...[{len(text):,} characters]"


def bad_text(v: str) -> str | None:
    """What is wrong with a text value (too long, not valid Unicode), or None."""
    if len(v) > MAX_VALUE_CHARS:
        return f"is {len(v):,} characters long (at most {MAX_VALUE_CHARS:,})"
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode text (a lone surrogate)"
    return None


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a case: its id, table, source and truth label, and its JSON object (`data`: the rows
    or the file, as its suite keeps them). The truth label is for the grader and oracles only."""
    batch_id: str
    table: str
    source: str
    truth: Mapping[str, Any]
    data: Mapping[str, Any]

    @property
    def defective(self) -> bool:
        return bool(self.truth["defective"])


@dataclass(frozen=True, slots=True)
class Case:
    """One case, checked: see the module docstring. `data` is the JSON object as read."""
    case_id: str
    family: str
    suite: str
    prompt: str
    contract: Mapping[str, Any]
    batches: tuple[Batch, ...]
    data: Mapping[str, Any]

    def __hash__(self) -> int:
        return hash((self.suite, self.case_id))

    @property
    def defective_ids(self) -> list[str]:
        """Truth labels (the grader and oracle agents only; never shown to an agent)."""
        return [b.batch_id for b in self.batches if b.defective]

    def line(self) -> str:
        """The case as one line of a case file."""
        return dumps_case(self.data)


def _record(obj: dict, suite: Suite) -> Case:
    batches = tuple(Batch(b["batch_id"], b["table"], b["source"], b["truth"], b) for b in obj["batches"])
    return Case(obj["case_id"], obj["family"], suite.name, obj["prompt"], obj["contract"], batches, obj)


def load_case(obj, where: str = "case", contract_checked: bool = False) -> Case:
    """Check one case's JSON object and return it as a `Case`, or raise CaseError naming `where`.

    `contract_checked`: the case's contract is the same JSON value as one already checked (every case
    of a file carries the same one; `contract_key`), so it is not checked again."""
    if isinstance(obj, Case):
        return obj
    if not isinstance(obj, dict):
        raise fail(where, f"a case must be a JSON object, not {type(obj).__name__}")
    try:
        suite = suites.of_data(obj)
    except UnknownSuite as exc:
        raise fail(where, str(exc)) from None
    missing = [k for k in suite.case_keys if k not in obj]
    if missing:
        raise fail(where, f"case lacks key(s) {missing}")
    cid = obj["case_id"]
    if bad_id(cid):
        raise fail(where, f"'case_id' must be a non-empty string of at most {MAX_ID_CHARS} printable characters")
    where = f"{where} ({cid})"
    if not contract_checked:
        try:
            suite.validate_contract(obj["contract"], f"{where} contract")
        except ContractError as exc:
            raise CaseError(str(exc)) from None
    for key in ("prompt", "family"):
        if not isinstance(obj[key], str):
            raise fail(where, f"'{key}' must be a string")
        problem = bad_text(obj[key])  # a string, but too long or not valid Unicode: said so, not "must be a string"
        if problem:
            raise fail(where, f"'{key}' {problem}")
    suite.check_case(obj, where)
    batches = obj["batches"]
    if not isinstance(batches, list) or not batches:
        raise fail(where, "'batches' must be a non-empty list")
    staged: dict[str, str] = {}
    for k, batch in enumerate(batches):
        bw = f"{where} batch {k}"
        if not isinstance(batch, dict):
            raise fail(bw, "a batch must be an object")
        missing = [key for key in suite.batch_keys if key not in batch]
        if missing:
            raise fail(bw, f"batch lacks key(s) {missing}")
        bid = batch["batch_id"]
        if bad_id(bid):
            raise fail(bw, f"'batch_id' must be a non-empty string of at most {MAX_ID_CHARS} printable characters")
        name = staging_table(bid)
        if name in staged:
            other = staged[name]
            raise fail(bw, f"batch id {bid!r} repeats" if other == bid else
                       f"batch ids {other!r} and {bid!r} would share the staging table {name}")
        staged[name] = bid
        if not isinstance(batch["table"], str) or batch["table"] not in suite.columns:
            raise fail(bw, f"'table' must be one of {list(suite.columns)}, not {json.dumps(batch['table'])[:80]}")
        if not isinstance(batch["source"], str):
            raise fail(bw, "'source' must be a string")
        if bad_text(batch["source"]):
            raise fail(bw, f"'source' {bad_text(batch['source'])}")
        suite.check_batch(batch, bw)
        truth = batch["truth"]
        if not isinstance(truth, dict) or not isinstance(truth.get("defective"), bool):
            raise fail(bw, "'truth' must be an object with a boolean 'defective'")
    if suite.check_rest is not None:
        suite.check_rest(obj, where)
    return _record(obj, suite)


def dumps_case(case: Mapping) -> str:
    """One line of a case file: sorted keys, default separators, ASCII-escaped."""
    return json.dumps(case, sort_keys=True) + "\n"


def write_cases(path: str | Path, cases: Iterable) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for case in cases:
            fh.write(case.line() if isinstance(case, Case) else dumps_case(case))
    return path


def parse_cases(text: str, where: str) -> list[Case]:
    return parse_lines(json_lines(text), where)


def parse_lines(lines: list[str], where: str) -> list[Case]:
    """The cases of a case file's lines (`files.json_lines`), each checked. The list is emptied as it is
    read: a line is let go once its case is parsed, so a file's text is not held twice over."""
    cases: list[Case] = []
    ids: set[str] = set()
    for lineno, case in _parsed(lines, where):
        if case.case_id in ids:
            raise _repeats(where, lineno, case.case_id)
        ids.add(case.case_id)
        cases.append(case)
    return cases


def _repeats(where: str, lineno: int, case_id: str) -> CaseError:
    return CaseError(f"{where}:{lineno}: case id {case_id!r} repeats")


def _blank(line: str) -> bool:
    return not line or line.isspace()


def contract_key(obj) -> bytes | None:
    """What tells a case's contract from another: its `marshal` bytes with the case's suite (which checks it), the
    same only for the same JSON value, types and key order included (Python's `==` has `true == 1` and `5.0 == 5`,
    which a contract's check tells apart), under the same suite.
    Two equal contracts may have other bytes (marshal writes an object it meets twice as a reference to the
    first): that costs a check, never a wrong answer. None for an object that is no case with a contract, or one
    nested too deep to write out (then it is checked)."""
    if type(obj) is not dict or "contract" not in obj:
        return None
    try:
        return marshal.dumps((obj.get("suite"), obj["contract"]))
    except ValueError:
        return None


def _parsed(lines: list[str], where: str, first: int = 1,
            contract: bytes | None = None) -> Iterator[tuple[int, Case]]:
    """(line number, case) of each line that is not blank, in order, `lines[0]` being line `first`; a line
    that is not a case is a CaseError naming it. `contract`: the `contract_key` of the case on the line before
    `first` (a case whose contract is the same as the one before it is not checked again, `load_case`). Each
    line is let go (emptied in the list) as it is read."""
    for at, line in enumerate(lines):
        lines[at] = ""
        if _blank(line):
            continue
        lineno = first + at
        obj = _decoded(line, where, lineno)
        key = contract_key(obj)
        case = load_case(obj, f"{where}:{lineno}", key is not None and key == contract)
        contract = key
        yield lineno, case


def _loads(line: str):
    """`json.loads`, whose parser stops at Python's recursion limit, counted from wherever it is called: a
    line it stops on is parsed again on a thread of its own, so how deep a line may nest is the same for
    every caller (a file read whole, a worker's share, a caller deep in its stack)."""
    try:
        return json.loads(line)
    except RecursionError:
        pass
    out: dict = {}

    def parse() -> None:
        try:
            out["value"] = json.loads(line)
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=parse, name="gate-json")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _decoded(line: str, where: str, lineno: int):
    try:
        return _loads(line)
    except json.JSONDecodeError as exc:
        at = "" if exc.msg.endswith(" at") else " at"  # ("Unterminated string starting at", at column N)
        raise CaseError(f"{where}:{lineno}: not JSON ({exc.msg}{at} column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise CaseError(f"{where}:{lineno}: not a case ({exc})") from None
    except RecursionError:
        raise CaseError(f"{where}:{lineno}: not a case (JSON nested too deep)") from None


@dataclass
class Share:
    """What a worker made of its share of a case file's lines (`CaseLines.share`): each case's line and id,
    the suites named (in order), the cases, and the error of the first line that is not a case, if any (the
    cases before it are kept, so the caller can first look for an id repeated from an earlier share)."""
    ids: list[tuple[int, str]]
    suites: list[str]
    cases: list[Case]
    error: BaseException | None = None


class CaseLines:
    """A case file's text split into lines, its cases not parsed yet: what `read_cases` reads, for a batch
    that parses each worker's share of the lines in the worker (`engine.play_cases`), rather than every case
    in the parent before the workers start. The checks are `read_cases`'s (each line a case, ids unique, at
    least one case) and `suite_of_cases`'s (one suite), with the same words: a worker checks its share, and
    the parent puts the shares together in file order before any case is played, so the error raised is the
    first in file order, as reading the file whole raises it (cases of two suites once every line is read)."""

    def __init__(self, text: str, where: str):
        self.where = where
        self.lines = json_lines(text)
        self.at = [k for k, line in enumerate(self.lines) if not _blank(line)]  # the lines that hold a case
        if not self.at:
            raise CaseError(f"{where}: no cases in file")

    @classmethod
    def read(cls, path: str | Path) -> "CaseLines":
        return cls(read_case_text(path), str(Path(path)))

    def __len__(self) -> int:
        """How many lines hold a case (none is blank)."""
        return len(self.at)

    def first(self) -> Case:
        """The first case, parsed and checked (its suite names a report's default agents)."""
        return next(_parsed([self.lines[self.at[0]]], self.where, self.at[0] + 1))[1]

    def parsed(self) -> list[Case]:
        """Every case, parsed and checked here (ids unique), in file order; the lines are let go as they are
        parsed (`read_cases`)."""
        lines, self.lines = self.lines, []
        return parse_lines(lines, self.where)

    def cases(self) -> list[Case]:
        """Every case, parsed and checked here, of one suite; the lines are let go as they are parsed."""
        cases = self.parsed()
        suite_of_cases(cases)
        return cases

    def bounds(self, parts: int) -> list[tuple[int, int]]:
        """(start, stop) line indices of `parts` contiguous shares of the lines, each holding as many cases as
        can be (`contiguous`; the first starts at the first line, the last ends after the last)."""
        starts = [self.at[start] if start else 0 for start, _ in contiguous(len(self.at), parts)]
        return list(zip(starts, starts[1:] + [len(self.lines)]))

    def line_number(self, stop: int) -> int:
        """The number of the last line before index `stop` (the empty text after a final newline is no line)."""
        return min(stop, len(self.lines) - (self.lines[-1] == "" if self.lines else 0))

    def share(self, start: int, stop: int) -> Share:
        """The cases of lines[start:stop], parsed and checked (a worker's share), each contract taken as the
        whole file's reading takes it (checked unless it equals the one of the case on the line before). Ids
        are not compared here, nor suites, which the parent does across the shares (`put_together`)."""
        out = Share([], [], [])
        try:
            for lineno, case in _parsed(self.lines[start:stop], self.where, start + 1, self._contract_before(start)):
                out.ids.append((lineno, case.case_id))
                out.cases.append(case)
        except Exception as exc:  # noqa: BLE001 - a CaseError, or a defect: raised by the parent after the ids
            out.error = exc
        out.suites = list(dict.fromkeys(c.suite for c in out.cases))
        return out

    def _contract_before(self, start: int) -> bytes | None:
        """The `contract_key` of the case on the last line before `start` that is not blank, read as `_parsed`
        reads it (None if there is none, or it is no case: then the line's own error comes first, from the
        share before)."""
        k = bisect.bisect_left(self.at, start) - 1
        if k < 0:
            return None
        try:
            return contract_key(_loads(self.lines[self.at[k]]))
        except (ValueError, RecursionError):
            return None

    def put_together(self, share: Share, ids: set[str], suites: dict[str, None]) -> None:
        """Check a share against the shares before it (`ids`, `suites`: theirs, updated): a repeated id, then
        the share's own error, are raised as `read_cases` would raise them."""
        for lineno, case_id in share.ids:
            if case_id in ids:
                raise _repeats(self.where, lineno, case_id)
            ids.add(case_id)
        if share.error is not None:
            raise share.error
        suites.update(dict.fromkeys(share.suites))

    def check_suites(self, suites: dict[str, None]) -> None:
        """Once every share is put together: the cases mix no suites."""
        if len(suites) > 1:
            raise _mixed(list(suites))


def read_case_text(path: str | Path) -> str:
    """A case file's text. Only a regular file of at most MAX_CASE_FILE_BYTES is read (`files.read_text`:
    never a device or a FIFO)."""
    return read_text(Path(path), "case file", MAX_CASE_FILE_BYTES, CaseError)


def cases_of_text(text: str, where: str) -> list[Case]:
    """Every case of a case file's text, in order, each checked; a text without cases is a CaseError."""
    return CaseLines(text, where).parsed()


def read_cases(path: str | Path) -> list[Case]:
    """Every case of a JSONL file, in file order, each checked (`read_case_text`, `CaseLines.parsed`). The
    file's text is split into lines and let go, and each line once its case is parsed: at most about
    twice the file's size is held while it is read (its text and its lines, or its lines and its cases)."""
    return CaseLines.read(path).parsed()


def contiguous(count: int, parts: int) -> list[tuple[int, int]]:
    """(start, stop) of `parts` contiguous shares of `count` items in order, as even as can be (a worker's
    share of the cases, `engine.play_cases`)."""
    return [(count * k // parts, count * (k + 1) // parts) for k in range(parts)]


def procedural_draws(seed: int, count: int, families) -> list[tuple[int, str, int, int]]:
    """(k, family, variant, seed) of each case of a procedural split: the families in turn, each case's
    variant (0-3) then its seed drawn, in that order, from one Random(seed) (CONFORMANCE §8)."""
    rng = random.Random(seed)
    return [(k, families[k % len(families)], rng.randint(0, 3), rng.randint(10**6, 10**9)) for k in range(count)]


def _mixed(names: list[str]) -> CaseError:
    return CaseError(f"the cases mix suites ({', '.join(names)}); play one suite at a time")


def split_of(path: str | Path) -> str:
    """The split a case file holds, by its name: "eval", "train", or the file's stem."""
    stem = Path(path).stem
    return "eval" if "eval" in stem else "train" if "train" in stem else stem


def suite_of_cases(cases: Iterable[Case]) -> Suite:
    """The one suite a list of cases belongs to; cases of two suites are a CaseError."""
    names = list(dict.fromkeys(c.suite for c in cases))
    if not names:
        return suites.default()
    if len(names) > 1:
        raise _mixed(names)
    return suites.get(names[0])
