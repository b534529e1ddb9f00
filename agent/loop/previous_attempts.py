"""What rank 0 of a restarted run learns of the attempts before it from the run's logs, before its
relay starts: how the last one ended (its Hello's `restart_cause`, for every UI, a late one too)
and every message goodput counts (its relay's count then starts at the run's start, as `summary`
does, not at this attempt's). Torch-free: `summary` reads restarts with the same functions."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringtop.metrics.run_lifecycle import fold, rank_end_of
from ringtop.protocol.messages import Hello
from ringtop.protocol.run_logs import (
    attempt_of,
    attempts,
    goodput_inputs,
    rank_logs,
    read_launcher_failures,
    silent_end,
)

MAX_LOG_BYTES = 256 * 2**20
"""Logs larger than this are not read at a restart (seconds of the new attempt's start): its
relay's goodput then starts at this attempt, and `summary` still has the whole run."""
MAX_CAUSE_CHARS = 1000


@dataclass(frozen=True)
class PreviousAttempts:
    cause: str
    """How the attempt before this one ended, in the lifecycle's words ('' if not known)."""
    goodput_inputs: list
    """Every message of the attempts before this one that goodput counts, in time order."""


def attempt_end_words(logs: list[tuple[int, list]], attempt: int, failures: dict[int, int]) -> str:
    """How attempt `attempt` of a restarted run ended, in the lifecycle's words ('' if it completed:
    then no failure restarted the run); `failures`: pid -> exit code, as the launcher saw its
    workers fail (protocol/run_logs.py), for the ranks that ended without a Bye."""
    world, ends = 0, []
    for rank, messages in logs:
        parts = [part for part in attempts(messages) if attempt_of(part) == attempt]
        if parts:  # the latest process of the rank in that attempt
            world = max([world, rank + 1, *(m.world_size for m in parts[-1] if isinstance(m, Hello))])
            ends.append(rank_end_of(rank, parts[-1], silent_end(parts[-1], failures)))
    if not ends:
        return ""
    life = fold(ends, world_size=world)
    return life.cause or (life.words if life.state != "ended" else "")


def read_previous(log_dir: Path, attempt: int) -> PreviousAttempts | None:
    """None when there is nothing to read (no logs, not a restart) or too much (MAX_LOG_BYTES)."""
    if attempt <= 0 or not log_dir.is_dir():
        return None
    try:
        size = sum(p.stat().st_size for p in log_dir.glob("rank-*.jsonl"))
    except OSError:
        return None
    if size > MAX_LOG_BYTES:
        print(f"ringtop agent [rank 0]: the run's logs ({size / 2**20:.0f} MiB) are not read at this restart: "
              "its goodput starts at this attempt (ringtop summary has the whole run)", file=sys.stderr)
        return None
    earlier = [(rank, [m for part in attempts(messages) if attempt_of(part) < attempt for m in part])
               for rank, messages in rank_logs(log_dir)]
    last = max((attempt_of(p) for _, messages in earlier for p in attempts(messages) if p), default=None)
    failures = read_launcher_failures(log_dir)  # `ringtop run` keeps its launcher's output there
    cause = attempt_end_words(earlier, last, failures) if last is not None else ""
    return PreviousAttempts(cause[:MAX_CAUSE_CHARS], goodput_inputs(earlier))


def take_over(relay: Any, log_dir: str | None, attempt: int) -> str:
    """Attempt `attempt` (0: the first) of a run, its head relay built and not yet started: the
    relay's goodput is given the attempts before (None: only the cause is wanted, the relay is in
    the watcher, which reads them itself); returns how the last of them ended ('' if not known)."""
    previous = read_previous(Path(log_dir), attempt) if log_dir else None
    if previous is None:
        return ""
    if relay is not None and relay.goodput is not None:  # before its thread starts: no race
        for msg in previous.goodput_inputs:
            relay.goodput.add(msg)
    return previous.cause
