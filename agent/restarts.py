"""Which attempt of a run this process belongs to, and the run id all its attempts share.

A launcher that restarts a failed run (torchrun --max-restarts, a requeued Slurm job) starts every
rank again in new processes. Without a run id given (--run-id), rank 0 would pick a new one each
time and every attempt would be a new run to the UI, the logs and goodput; instead the id is
derived from what the launcher keeps across its attempts."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping

MAX_RESTART_COUNT = 1_000_000
RESTART_COUNT_ENV = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def _count(text: str) -> int | None:
    if not text.isascii() or not text.isdigit() or len(text) > 7:
        return None
    n = int(text)
    return n if n <= MAX_RESTART_COUNT else None


def restart_count(env: Mapping[str, str]) -> int:
    """0 for the first attempt; a value that is not a small number counts as 0."""
    for name in RESTART_COUNT_ENV:
        n = _count(env.get(name, ""))
        if n is not None:
            return n
    return 0


def max_restarts(env: Mapping[str, str]) -> int:
    """How many restarts the launcher allows in all (torchrun's --max-restarts); 0: none or unknown."""
    n = _count(env.get("TORCHELASTIC_MAX_RESTARTS", ""))
    return n if n is not None else 0


def launcher_run_id(env: Mapping[str, str]) -> str | None:
    """An 8-hex run id the same in every attempt of one launch, or None outside a launcher that
    restarts. torchrun's rendezvous id when it has one (`--standalone` makes one per launch); with
    the default `none`, this host, torchrun's process (the ranks' parent) and its port: the same
    across the attempts of a static launch, where rank 0 stays on its node. Slurm: the job id."""
    if "TORCHELASTIC_RESTART_COUNT" in env:
        rendezvous = env.get("TORCHELASTIC_RUN_ID", "")
        key = (f"torchrun:{rendezvous}" if rendezvous not in ("", "none") else
               f"torchrun:{socket.gethostname()}:{os.getppid()}:{env.get('MASTER_PORT', '')}")
    elif env.get("SLURM_JOB_ID"):
        key = f"slurm:{env['SLURM_JOB_ID']}:{env.get('SLURM_STEP_ID', '')}"
    else:
        return None
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:8]
