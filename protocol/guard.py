"""Keeping a thread's loop alive: whatever a peer sends or the system refuses, it counts it and goes on.

An OSError (EMFILE: out of file descriptors, ENOMEM, ...) is the system's, not the input's: the
loop backs off, longer while it lasts (up to MAX_BACKOFF_S), instead of spinning or dying; the
sampler that died of EMFILE under a connection flood sent no sample for the rest of the run."""

from __future__ import annotations

import errno
import sys
import time

import zmq

MAX_BACKOFF_S = 1.0
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.ENOSPC}


class LoopFaults:
    """Counts unexpected exceptions in one receive loop and reports a few per minute to stderr
    (escaped, cut short), so hostile input can neither kill the loop nor flood the log."""

    def __init__(self, where: str, per_minute: int = 5) -> None:
        self.where = where
        self.per_minute = per_minute
        self.count = 0
        self._window_start = time.monotonic()
        self._reported = 0
        self._backoff_s = 0.0
        self._last_fault = 0.0

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
        if is_system_error(exc):
            quiet = now - self._last_fault > 2 * MAX_BACKOFF_S
            self._backoff_s = 0.01 if quiet else min(MAX_BACKOFF_S, max(0.01, 2 * self._backoff_s))
            self._last_fault = now
            time.sleep(self._backoff_s)


def is_system_error(exc: BaseException) -> bool:
    """The system refused something (any OSError: EMFILE, ENOMEM, ...; ZeroMQ's errors for running
    short of descriptors, memory, buffers or disk), not the input: worth waiting for."""
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, zmq.ZMQError) and exc.errno in _RESOURCE_ERRNOS
