"""No rank outlives the command that started it: torch-free helpers shared by the CLI (which
starts the launcher) and the agent (each rank)."""

from __future__ import annotations

import ctypes
import signal
import sys

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1

EXIT_WITH_PARENT_ENV = "RINGTOP_EXIT_WITH_PARENT"
"""Set for the launcher and the ranks ringtop starts: each asks the kernel for a SIGTERM when its
parent dies (`exit_with_parent`), so no rank outlives the command that started it."""


def exit_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies (prctl
    PR_SET_PDEATHSIG); a no-op elsewhere. Safe in a preexec_fn: nothing is imported or locked."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
