"""Keeping receive loops alive: whatever a peer sends, the loop counts it and goes on."""

from __future__ import annotations

import sys
import time


class LoopFaults:
    """Counts unexpected exceptions in one receive loop and reports a few per minute to stderr
    (escaped, cut short), so hostile input can neither kill the loop nor flood the log."""

    def __init__(self, where: str, per_minute: int = 5) -> None:
        self.where = where
        self.per_minute = per_minute
        self.count = 0
        self._window_start = time.monotonic()
        self._reported = 0

    def record(self, exc: BaseException) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._window_start >= 60.0:
            self._window_start, self._reported = now, 0
        if self._reported < self.per_minute:
            self._reported += 1
            text = ascii(str(exc))[:300]
            print(f"ringtop {self.where}: ignored an unexpected {type(exc).__name__}: {text} "
                  f"({self.count} so far)", file=sys.stderr, flush=True)
