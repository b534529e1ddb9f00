"""A goodput count handed over (metrics/goodput.py): what `Goodput.state()` gives rank 0's relay to
send each new subscriber (protocol: GoodputSoFar), and the check a received one must pass before a
`Goodput` goes on from it: one whose values do not fit together is not believed.

Stdlib only and duck-typed, like goodput.py: the protocol's decoder bounds each field, this checks
that they agree with each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_STARTUP_S = 86400.0
"""A process start further back than this before its Hello is not believed (a clock jump)."""
MAX_OPEN_STALLS = 1 << 16
"""A state reporting more stalls in progress than this is not believed."""
HANDED_STEPS = 256
HANDED_STALLS = 64
"""How many of the latest steps and ended stalls a state carries."""


@dataclass(frozen=True)
class GoodputState:
    """Everything `Goodput` needs to go on counting from `as_of_ts` (protocol: GoodputSoFar)."""

    run_id: str
    world_size: int
    started_ts: float
    as_of_ts: float
    first_step_start_ts: float | None
    step_end_ts: float | None
    steps: int
    productive_s: float
    checkpoint_s: float
    switch_s: float
    skipped_s: float
    stall_closed_s: float
    """Seconds of stalls that had ended, merged across ranks."""
    startup_s: float | None
    """Start-up's lost seconds, once the first step has begun (fixed from then on)."""
    open_stalls: tuple[tuple[int, float], ...]
    """(rank, start) of each stall in progress."""
    recent_steps: tuple[tuple[float, float], ...] = ()
    """Rank 0's latest steps, (start, end): what a later checkpoint overlapped."""
    recent_stalls: tuple[tuple[float, float], ...] = ()
    """The latest ended stalls (within stall_closed_s): what a later, long step overlapped."""
    restart_s: float = 0.0
    """Restarts' lost seconds, but for the one in progress."""
    restarts: int = 0
    """The highest `restart_count` seen."""
    restart_from_ts: float | None = None
    """Start of the restart in progress (the end of rank 0's last step before it); None if none."""
    redo_through_step: int | None = None
    """Rank 0's steps numbered up to this redo work (the highest step before the latest restart)."""
    top_step: int | None = None
    """The highest step number rank 0 reached."""


def real(x: Any) -> float | None:
    """x as a finite float; None if it is not a finite number (a bool is not one)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def count(x: Any) -> int | None:
    """x if it is an int >= 0 (a bool is not one), else None."""
    return x if type(x) is int and x >= 0 else None


def _pairs(items: Any, most: int, first: Any, second: Any) -> list[tuple] | None:
    """Up to `most` 2-item pairs, each item read by `first` and `second` (`real`, `count`); None if
    any is not such a pair."""
    if not isinstance(items, (list, tuple)) or len(items) > most:
        return None
    found = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            return None
        a, b = first(item[0]), second(item[1])
        if a is None or b is None:
            return None
        found.append((a, b))
    return found


def _intervals(items: Any, lo: float, hi: float, most: int) -> list[tuple[float, float]] | None:
    """(start, end) pairs inside [lo, hi], in time order and not overlapping; None if they are not."""
    found = _pairs(items, most, real, real)
    if found is None or any(not lo <= s <= e <= hi for s, e in found):
        return None
    if any(s < previous_end for (_, previous_end), (s, _) in zip(found, found[1:])):
        return None
    return found


def _open_stalls(items: Any, lo: float, hi: float) -> tuple[tuple[int, float], ...] | None:
    """(rank, start) pairs with a start inside [lo, hi]; None if they are not."""
    found = _pairs(items, MAX_OPEN_STALLS, count, real)
    if found is None or any(not lo <= start <= hi for _, start in found):
        return None
    return tuple(found)


def _restarts(msg: Any, started: float, step_end: float | None) -> tuple | None:
    """(restart_s, restarts, restart_from_ts, redo_through_step, top_step), or None if they do not
    fit together (a restart in progress began at the end of a step of rank 0's)."""
    seconds, restarts = real(getattr(msg, "restart_s", 0.0)), count(getattr(msg, "restarts", 0))
    since_ts = getattr(msg, "restart_from_ts", None)
    since = real(since_ts)
    redo, top = getattr(msg, "redo_through_step", None), getattr(msg, "top_step", None)
    if seconds is None or seconds < 0 or restarts is None or (redo, top) != (count(redo), count(top)):
        return None
    if since_ts is not None and (since is None or step_end is None or not started <= since <= step_end):
        return None
    if redo is not None and (top is None or redo > top):
        return None
    if restarts == 0 and (seconds > 0 or since is not None or redo is not None):
        return None
    return seconds, restarts, since, redo, top


def checked_state(msg: Any) -> GoodputState | None:
    """The count a `goodput` message (fields as GoodputState) carries, if it adds up; else None."""
    run_id, world = getattr(msg, "run_id", ""), getattr(msg, "world_size", 0)
    started, as_of = real(getattr(msg, "started_ts", None)), real(getattr(msg, "as_of_ts", None))
    seconds = [real(getattr(msg, k, None)) for k in
               ("productive_s", "checkpoint_s", "switch_s", "skipped_s", "stall_closed_s")]
    steps = count(getattr(msg, "steps", None))
    if not isinstance(run_id, str) or started is None or as_of is None:
        return None
    if not 0 <= as_of - started < 10 * MAX_STARTUP_S or any(v is None or v < 0 for v in seconds) or steps is None:
        return None
    productive, checkpoint, switch, skipped, stalled = seconds
    step_end = real(getattr(msg, "step_end_ts", None))
    if step_end is not None and not started <= step_end <= as_of:
        return None
    restarts = _restarts(msg, started, step_end)
    if restarts is None:
        return None
    most = (as_of - started) * (1 + 1e-9) + 1e-6
    if productive + skipped + restarts[0] > most or stalled > most:
        return None
    first_step = real(getattr(msg, "first_step_start_ts", None))
    startup = real(getattr(msg, "startup_s", None))
    if startup is not None and not 0 <= startup <= most:
        return None
    if first_step is not None and not started <= first_step <= as_of:
        return None
    opened = _open_stalls(getattr(msg, "open_stalls", ()), started, as_of)
    steps_kept = _intervals(getattr(msg, "recent_steps", ()), started, as_of, HANDED_STEPS)
    stalls_kept = _intervals(getattr(msg, "recent_stalls", ()), started, as_of, HANDED_STALLS)
    if opened is None or steps_kept is None or stalls_kept is None:
        return None
    if sum(e - s for s, e in stalls_kept) > stalled + 1e-6:
        return None
    return GoodputState(
        run_id=run_id, world_size=world if type(world) is int and world > 0 else 0, started_ts=started,
        as_of_ts=as_of, first_step_start_ts=first_step, step_end_ts=step_end, steps=steps, productive_s=productive,
        checkpoint_s=checkpoint, switch_s=switch, skipped_s=skipped, stall_closed_s=stalled, startup_s=startup,
        open_stalls=opened, recent_steps=tuple(steps_kept), recent_stalls=tuple(stalls_kept),
        restart_s=restarts[0], restarts=restarts[1], restart_from_ts=restarts[2], redo_through_step=restarts[3],
        top_step=restarts[4])
