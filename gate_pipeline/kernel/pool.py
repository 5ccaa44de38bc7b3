"""The one case pool: cases by id, each prepared once on first use and shared, and the default case file.

Every surface that plays cases by id goes through a `CasePool`: the gymnasium and verifiers
environments, `gate serve`'s sessions, `gate run`, `gate replay`. A case is prepared (its
database image, listing, profiles, correct mart) the first time an episode of it opens, by its
suite, and every later episode of it opens a private copy (or borrows it, see the suite's world).
Preparing is guarded by a lock, so threads (an HTTP server's) may share a pool.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterable, Iterator

from .cases import Case, CaseError, load_case, read_cases, suite_of_cases
from .settings import Settings
from .suite import Suite, suites
from .world import PreparedCase


def default_cases_file(settings: Settings, split: str = "eval", suite: str | None = None) -> Path:
    """A suite's case file of `split` under the settings' cases directory (default suite: the default one)."""
    return settings.cases_file(split, suite or suites.default().name)


class CasePool:
    """Cases by id (ids unique), each prepared once and shared; all of one suite."""

    def __init__(self, cases: Iterable):
        self.cases: list[Case] = [load_case(c, f"cases[{i}]") for i, c in enumerate(cases)]
        if not self.cases:
            raise CaseError("a case pool needs at least one case")
        self.index = {c.case_id: i for i, c in enumerate(self.cases)}
        if len(self.index) != len(self.cases):
            raise CaseError("cases: case ids repeat")
        self.suite: Suite = suite_of_cases(self.cases)
        self._prepared: dict[str, PreparedCase] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path) -> "CasePool":
        return cls(read_cases(path))

    @classmethod
    def default(cls, settings: Settings, split: str = "eval", suite: str | None = None) -> "CasePool":
        """The pool of a suite's split under the settings' cases directory."""
        return cls(read_cases(default_cases_file(settings, split, suite)))

    def __len__(self) -> int:
        return len(self.cases)

    def __iter__(self) -> Iterator[Case]:
        return iter(self.cases)

    def __contains__(self, case_id) -> bool:
        return isinstance(case_id, str) and case_id in self.index

    @property
    def ids(self) -> list[str]:
        return [c.case_id for c in self.cases]

    def case(self, case_id: str) -> Case:
        try:
            return self.cases[self.index[case_id]]
        except (KeyError, TypeError):
            raise CaseError(f"no case {str(case_id)[:80]!r} in the pool") from None

    def prepared(self, case_id: str) -> PreparedCase:
        """The case's prepared image, built on first use and kept."""
        prepared = self._prepared.get(case_id)
        if prepared is None:
            case = self.case(case_id)
            with self._lock:
                prepared = self._prepared.get(case_id)
                if prepared is None:
                    prepared = self._prepared[case_id] = self.suite.prepared_case(case)
        return prepared

    def close(self) -> None:
        with self._lock:
            for prepared in self._prepared.values():
                prepared.close()
            self._prepared.clear()
