"""Collects the collectives a strategy issues: kind, bytes, group size, issue and completion time.

`begin` runs on the training thread (inside a comm hook), `end` on the backend's completion thread.
Both only append to lists; `drain` at the step boundary turns them into per-kind totals.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class KindTotals:
    kind: str
    count: int
    bytes: int
    busy_ms: float
    group_size: int


@dataclass(frozen=True)
class CommSummary:
    kinds: list[KindTotals]
    blocked_ms: float
    """Exposed communication: the training thread's measured waits when the strategy reports them;
    for DDP (whose reducer waits in C++) the time from the last bucket's issue to the last
    completion, since after the last bucket is issued backward has no compute left to hide behind."""
    busy_ms: float
    """Union of the collectives' in-flight intervals."""


class CommTracer:
    def __init__(self) -> None:
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._open: dict[int, tuple[str, int, int, int]] = {}
        self._done: list[tuple[str, int, int, int, int]] = []
        self._blocked: list[tuple[int, int]] = []

    def begin(self, kind: str, nbytes: int, group_size: int) -> int:
        handle = next(self._ids)
        with self._lock:
            self._open[handle] = (kind, nbytes, group_size, time.perf_counter_ns())
        return handle

    def end(self, handle: int) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            opened = self._open.pop(handle, None)
            if opened is not None:
                kind, nbytes, group_size, t0 = opened
                self._done.append((kind, nbytes, group_size, t0, now))

    def blocked(self, start_ns: int, end_ns: int) -> None:
        with self._lock:
            self._blocked.append((start_ns, end_ns))

    def drain(self) -> CommSummary:
        with self._lock:
            done, self._done = self._done, []
            blocked, self._blocked = self._blocked, []
        totals: dict[str, list[float]] = {}
        for kind, nbytes, group_size, t0, t1 in done:
            agg = totals.setdefault(kind, [0, 0, 0.0, group_size])
            agg[0] += 1
            agg[1] += nbytes
            agg[2] += (t1 - t0) / 1e6
        if blocked:
            blocked_ms = union_ns(blocked) / 1e6
        elif done:
            blocked_ms = max(0.0, (max(d[4] for d in done) - max(d[3] for d in done)) / 1e6)
        else:
            blocked_ms = 0.0
        busy_ms = union_ns([(d[3], d[4]) for d in done]) / 1e6
        kinds = [KindTotals(k, int(v[0]), int(v[1]), float(v[2]), int(v[3])) for k, v in totals.items()]
        return CommSummary(kinds=kinds, blocked_ms=min(blocked_ms, busy_ms) if done else blocked_ms, busy_ms=busy_ms)


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length covered by possibly overlapping intervals."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
