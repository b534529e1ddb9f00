"""Whether a process on this host has ended: one answer for the connection files (a run whose rank
0 is gone is stale) and the UI's exit probe (a silent rank whose process is gone has died).

`os.kill(pid, 0)` alone is not enough: it succeeds on a zombie, a process that has exited and
whose parent has not reaped it yet (a rank 0 killed by SIGKILL under a launcher that has not
waited for it), so a dead run would look alive. /proc says which state a process is in.
"""

from __future__ import annotations

import os
from typing import NamedTuple

ENDED_STATES = ("Z", "X")
"""/proc/PID/stat's states of a process that has exited: zombie, dead."""


def process_gone(pid: int, others_count_as_gone: bool = False) -> bool:
    """True when `pid` is no process on this host, or one that has exited and is only waiting to
    be reaped (a zombie). `others_count_as_gone`: a process of another user is taken as gone too
    (the pid of one of ours that ended, reused). Without /proc (not Linux) a zombie cannot be
    told apart: `os.kill(pid, 0)` decides."""
    if pid <= 0:
        return True
    try:
        owner, fields = _stat(pid)
    except (OSError, IndexError):
        if os.path.exists("/proc/self/stat"):
            return True
        return _gone_by_signal(pid, others_count_as_gone)
    if not fields or fields[0].decode(errors="replace") in ENDED_STATES:
        return True
    return others_count_as_gone and owner != os.getuid()


def _stat(pid: int) -> tuple[int, list[bytes]]:
    """(owner uid, the fields of /proc/PID/stat after the process's name, which may hold spaces)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return os.fstat(f.fileno()).st_uid, f.read().rsplit(b")", 1)[1].split()


def _gone_by_signal(pid: int, others_count_as_gone: bool) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return others_count_as_gone
    return False


class ProcessLook(NamedTuple):
    """A live process as /proc shows it from outside: its state letter, its CPU seconds so far and
    when it started (Unix s)."""

    state: str
    cpu_s: float
    started_ts: float


SAME_START_S = 2.0
"""How far a process's start may be from the one a Hello states for it to be that rank's (the
kernel's clock ticks against psutil's reading of the same)."""


def look(pid: int, started_ts: float = 0.0) -> ProcessLook | None:
    """How process `pid` of this user on this host is, or None where it is gone, a zombie, another
    user's, not the process that started at `started_ts` (a Hello's `process_started_ts`; 0: not
    checked) — its pid reused, a made-up one — or /proc cannot say (not Linux)."""
    if pid <= 0:
        return None
    try:
        owner, fields = _stat(pid)
        state = fields[0].decode("ascii", "replace")
        tick_s = 1.0 / _ticks_per_s()
        # after the name: utime, stime and starttime are stat's fields 14, 15 and 22
        cpu_s, started = (int(fields[11]) + int(fields[12])) * tick_s, _boot_ts() + int(fields[19]) * tick_s
    except (OSError, IndexError, ValueError):
        return None
    if state in ENDED_STATES or owner != os.getuid():
        return None
    if started_ts > 0 and abs(started - started_ts) > SAME_START_S:
        return None
    return ProcessLook(state, cpu_s, started)


def _boot_ts() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def _ticks_per_s() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def zombie_exit_code(pid: int) -> int | None:
    """How an exited process of this user ended while its parent has not reaped it yet, as a
    launcher says it (negative: the signal that killed it; else its exit status); None where it
    is not a zombie of ours (still running, reaped, another's) or /proc cannot say."""
    try:
        owner, fields = _stat(pid)
        if fields[0] != b"Z" or owner != os.getuid():
            return None
        status = int(fields[49])  # stat's field 52, the wait status (Linux 3.5 and later)
    except (OSError, IndexError, ValueError):
        return None
    signal_number = status & 0x7F
    return -signal_number if signal_number else (status >> 8) & 0xFF


class CpuUse:
    """A process's CPU use between two looks, in % of one core, in tens (words that changed at
    every look would be news each time): the UI's exit probe and the watchers read it alike."""

    def __init__(self) -> None:
        self._at: dict[int, tuple[float, float]] = {}
        """key -> (its CPU seconds, when) at the latest look."""

    def pct(self, key: int, cpu_s: float, now: float) -> float | None:
        """Since the last look of `key` (None at the first)."""
        before = self._at.get(key)
        self._at[key] = (cpu_s, now)
        if before is None or now <= before[1]:
            return None
        return round(100.0 * max(0.0, cpu_s - before[0]) / (now - before[1]), -1)
