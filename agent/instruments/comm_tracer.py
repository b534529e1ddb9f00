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
    """Time from the last collective's issue to the last completion: after the last bucket is
    issued the backward pass has no compute left to hide communication behind."""


class CommTracer:
    def __init__(self) -> None:
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._open: dict[int, tuple[str, int, int, int]] = {}
        self._done: list[tuple[str, int, int, int, int]] = []

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

    def drain(self) -> CommSummary:
        with self._lock:
            done, self._done = self._done, []
        totals: dict[str, list[float]] = {}
        for kind, nbytes, group_size, t0, t1 in done:
            agg = totals.setdefault(kind, [0, 0, 0.0, group_size])
            agg[0] += 1
            agg[1] += nbytes
            agg[2] += (t1 - t0) / 1e6
        blocked_ms = 0.0
        if done:
            blocked_ms = max(0.0, (max(d[4] for d in done) - max(d[3] for d in done)) / 1e6)
        kinds = [KindTotals(k, int(v[0]), int(v[1]), float(v[2]), int(v[3])) for k, v in totals.items()]
        return CommSummary(kinds=kinds, blocked_ms=blocked_ms)
