"""Communication per step summed over the ranks that reported it (the Comm tab's window and
chart), and the collective kinds the run uses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ringtop.metrics.timing import finite_or_0
from ringtop.protocol import CommStat, Step

COMM_KIND_ORDER = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
"""Collective kinds in the order the screens list them; other kinds follow alphabetically."""


@dataclass(slots=True)
class CommStep:
    """Communication of one step: one rank's (`RankRow.comm_history`), or summed over the ranks that
    reported that step number (`CommLedger.steps`). Sums, so windows add them up; `ranks` counts
    the rank-steps summed, the divisor for per-step means."""

    step: int
    ranks: int = 0
    step_ms: float = 0.0
    data_ms: float = 0.0
    blocked_ms: float = 0.0
    """Exposed communication (Step.comm_blocked_ms)."""
    busy_ms: float = 0.0
    """Union of in-flight collective intervals (Step.comm_busy_ms)."""
    kinds: dict[tuple[str, int], CommStat] = field(default_factory=dict)
    """(kind, group size) -> the kind's totals, summed; busy_ms per kind adds each call's own time."""

    def add(self, other: "CommStep") -> None:
        self.ranks += other.ranks
        self.step_ms += other.step_ms
        self.data_ms += other.data_ms
        self.blocked_ms += other.blocked_ms
        self.busy_ms += other.busy_ms
        for c in other.kinds.values():
            self.add_comm(c)

    def add_comm(self, c: CommStat) -> None:
        acc = self.kinds.get((c.kind, c.group_size))
        if acc is None:
            acc = self.kinds[(c.kind, c.group_size)] = CommStat(kind=c.kind, group_size=c.group_size)
        acc.add(c)


class CommLedger:
    def __init__(self, points: int) -> None:
        self.steps: dict[int, CommStep] = {}
        """Per step number, communication summed over the ranks that reported it (bounded)."""
        self.kinds_seen: set[str] = set()
        self._points = points

    @property
    def kinds(self) -> list[str]:
        """The run's collective kinds, the common ones first in COMM_KIND_ORDER."""
        known = [k for k in COMM_KIND_ORDER if k in self.kinds_seen]
        return known + sorted(self.kinds_seen.difference(COMM_KIND_ORDER))

    def collect(self, msg: Step) -> CommStep | None:
        """Fold one rank's step in; returns that rank's own CommStep (None for a step without time)."""
        self.kinds_seen.update(c.kind for c in msg.comm)
        if not (math.isfinite(msg.step_ms) and msg.step_ms > 0):
            return None
        cs = CommStep(step=msg.step, ranks=1, step_ms=msg.step_ms, data_ms=finite_or_0(msg.data_ms),
                      blocked_ms=finite_or_0(msg.comm_blocked_ms), busy_ms=finite_or_0(msg.comm_busy_ms))
        for c in msg.comm:
            cs.add_comm(c)
        agg = self.steps.get(msg.step)
        if agg is None:
            if len(self.steps) >= self._points and msg.step < min(self.steps):
                return cs  # older than everything kept
            agg = self.steps[msg.step] = CommStep(step=msg.step)
            if len(self.steps) > self._points:
                del self.steps[min(self.steps)]
        agg.add(cs)
        return cs

    def clear(self) -> None:
        """A new strategy: the window and chart start again, in other collectives."""
        self.steps.clear()
        self.kinds_seen.clear()
