"""What rank 0 of a restarted run learns of the attempts before it from the run's logs, before its
relay starts: how the last one ended (its Hello's `restart_cause`, for every UI, a late one too)
and every message goodput counts (its relay's count then starts at the run's start, as `summary`
does, not at this attempt's)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ringtop.metrics.run_lifecycle import fold, rank_end_of
from ringtop.protocol.messages import Hello
from ringtop.protocol.run_logs import attempt_of, attempts, goodput_inputs, rank_logs

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
    world, ends = 0, []
    for rank, messages in earlier:
        parts = attempts(messages)
        last = max((attempt_of(p) for p in parts if p), default=None)
        if last is None:
            continue
        part = [p for p in parts if attempt_of(p) == last][-1]
        world = max([world, rank + 1, *(m.world_size for m in part if isinstance(m, Hello))])
        ends.append(rank_end_of(rank, part, "ended without a Bye"))
    life = fold(ends, world_size=world) if ends else None
    cause = life.words if life is not None and life.state != "ended" else ""
    return PreviousAttempts(cause[:MAX_CAUSE_CHARS], goodput_inputs(earlier))
