"""Where a step's time goes, from the per-step numbers every rank reports (Step): one definition
for the agent's diagnosis, the Comm tab, the ranks table and the end-of-run summary."""

from __future__ import annotations

import math


def compute_ms(step_ms: float, exposed_comm_ms: float, data_ms: float) -> float:
    """step - exposed communication - data loading, never < 0: the time the rank spent computing.

    Ranks in lockstep have equal step times (every collective waits for the last to arrive), so
    this, not the step time, tells the slow rank. NaN without a measured step (step_ms not > 0).
    """
    if not step_ms > 0:
        return math.nan
    return max(0.0, step_ms - exposed_comm_ms - data_ms)


def share_pct(part_ms: float, step_ms: float) -> float:
    """`part_ms` as a percentage of the step (exposed comm %, idle %); NaN without a step."""
    return 100.0 * part_ms / step_ms if step_ms > 0 else math.nan


def overlap_pct(busy_ms: float, exposed_ms: float) -> float:
    """The share of communication hidden behind compute: 1 - exposed / busy, clamped to 0..100.

    NaN when nothing was in flight (busy_ms not > 0) or the exposed time is unknown.
    """
    if not busy_ms > 0 or not math.isfinite(exposed_ms):
        return math.nan
    return min(100.0, max(0.0, 100.0 * (1.0 - exposed_ms / busy_ms)))


def finite_or_0(x: float) -> float:
    """A time from a message, NaN or missing taken as none at all."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else 0.0
