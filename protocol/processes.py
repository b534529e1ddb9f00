"""Whether a process on this host has ended: one answer for the connection files (a run whose rank
0 is gone is stale) and the UI's exit probe (a silent rank whose process is gone has died).

`os.kill(pid, 0)` alone is not enough: it succeeds on a zombie, a process that has exited and
whose parent has not reaped it yet (a rank 0 killed by SIGKILL under a launcher that has not
waited for it), so a dead run would look alive. /proc says which state a process is in.
"""

from __future__ import annotations

import os

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
        with open(f"/proc/{pid}/stat", "rb") as f:
            owner = os.fstat(f.fileno()).st_uid
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        if os.path.exists("/proc/self/stat"):
            return True
        return _gone_by_signal(pid, others_count_as_gone)
    if not fields or fields[0].decode(errors="replace") in ENDED_STATES:
        return True
    return others_count_as_gone and owner != os.getuid()


def _gone_by_signal(pid: int, others_count_as_gone: bool) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return others_count_as_gone
    return False
