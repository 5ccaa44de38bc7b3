"""One dynamic partition per case (key: the case id), kept in sync with the case files.

Every `*.jsonl` under the cases directory is a case file; its directory names the suite and
its file name the split (`eval_curated.jsonl` -> eval). A file that cannot be read is
reported and never causes a deletion: partitions go only when every file was readable and
the case is in none of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from ..kernel.cases import Case, CaseError, read_cases, split_of
from .location import run_settings

cases_partitions = dg.DynamicPartitionsDefinition(name="cases")


def cases_dir(path: str | Path | None = None) -> Path:
    """The cases directory given, else the one the settings of the run or tick name."""
    return Path(path) if path else run_settings().cases_dir


@dataclass(frozen=True)
class CaseRef:
    case_id: str
    path: Path
    suite: str
    split: str


@dataclass
class CaseIndex:
    refs: dict[str, CaseRef]
    problems: list[str]


_cache: dict[tuple, list[Case]] = {}


def _read(path: Path) -> list[Case]:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _cache:
        if len(_cache) > 16:
            _cache.clear()
        _cache[key] = read_cases(path)
    return _cache[key]


def case_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jsonl")) if root.is_dir() else []


def case_index(root: str | Path | None = None) -> CaseIndex:
    root = cases_dir(root)
    refs: dict[str, CaseRef] = {}
    problems = [] if root.is_dir() else [f"{root}: no such cases directory"]
    for path in case_files(root):
        try:
            cases = _read(path)
        except (CaseError, OSError) as exc:
            problems.append(str(exc))
            continue
        for case in cases:
            if case.case_id in refs:
                problems.append(f"{path}: case {case.case_id!r} also in {refs[case.case_id].path}; first kept")
                continue
            refs[case.case_id] = CaseRef(case.case_id, path, case.suite, split_of(path))
    return CaseIndex(refs, problems)


def load_case(case_id: str, root: str | Path | None = None) -> tuple[Case, CaseRef]:
    """The case with this id from the case files, and where it came from."""
    index = case_index(root)
    ref = index.refs.get(case_id)
    if ref is None:
        raise CaseError(f"no case {case_id!r} under {cases_dir(root)}")
    return next(c for c in _read(ref.path) if c.case_id == case_id), ref


def partition_changes(instance: dg.DagsterInstance, root: str | Path | None = None):
    """(keys to add, keys to delete, problems) to bring the `cases` partitions to the files."""
    index = case_index(root)
    existing = set(instance.get_dynamic_partitions(cases_partitions.name))
    wanted = list(index.refs)
    add = [k for k in wanted if k not in existing]
    delete = [] if index.problems else sorted(existing - set(wanted))
    return add, delete, index.problems


def sync_case_partitions(instance: dg.DagsterInstance, root: str | Path | None = None):
    """Apply `partition_changes` directly (used before the UI starts, and by tests)."""
    add, delete, problems = partition_changes(instance, root)
    if add:
        instance.add_dynamic_partitions(cases_partitions.name, add)
    for key in delete:
        instance.delete_dynamic_partition(cases_partitions.name, key)
    return add, delete, problems
