"""Findings that hold, not findings that flicker: a key is raised after it was found in `raise_after`
consecutive rounds, and cleared after it was missing from `clear_after` consecutive rounds.

One window of noise (a GC pause, a neighbour's burst, a checkpoint) then neither raises a finding
nor clears one; a finding on the edge of its threshold, found in every other round, is never
raised. Pure and torch-free: the agent's diagnosis (agent/health/diagnosis_exchange.py) uses it with the
K the rules module (metrics/rules/diagnosis.py) names.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Debounce(Generic[K]):
    raise_after: int
    clear_after: int
    active: set[K] = field(default_factory=set)
    _found_streak: dict[K, int] = field(default_factory=dict)
    _missing_streak: dict[K, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.raise_after < 1 or self.clear_after < 1:
            raise ValueError("raise_after and clear_after must be >= 1")

    def update(self, found: Iterable[K]) -> tuple[list[K], list[K]]:
        """One round's findings in; (raised now, cleared now) out, each in the order first seen."""
        now = list(dict.fromkeys(found))
        present = set(now)
        raised, cleared = [], []
        self._found_streak = {k: self._found_streak.get(k, 0) + 1 for k in now}
        for k in now:
            self._missing_streak.pop(k, None)
            if k not in self.active and self._found_streak[k] >= self.raise_after:
                self.active.add(k)
                raised.append(k)
        for k in sorted(self.active - present, key=repr):
            self._missing_streak[k] = self._missing_streak.get(k, 0) + 1
            if self._missing_streak[k] >= self.clear_after:
                self.active.discard(k)
                del self._missing_streak[k]
                cleared.append(k)
        return raised, cleared

    def drop(self, key: K) -> None:
        """Clear `key` now (a finding replaced by another, e.g. a new worst straggler)."""
        self.active.discard(key)
        self._missing_streak.pop(key, None)
