"""Why a pipeline step idled: theory, the replays of the schedule with each measured cause added in
turn (imbalance, transfers, per-op overhead) and the measurement, side by side. Built on
`pipeline_schedule`'s replay and its measurement of real per-micro-batch events; torch-free."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ringtop.metrics.costs.pipeline_schedule import (
    ScheduleReplay,
    estimate_overhead_ms,
    estimate_p2p_ms,
    op_ms,
    replay_schedule,
    stage_events,
    stage_times,
    theoretical_bubble,
)


def replay_from_events(events: Iterable, schedule: str, stages: int, micro_batches: int,
                       p2p_ms: float | None = None, overhead_ms: float | None = None) -> ScheduleReplay:
    """The replay with each op's measured time and the estimated (or given) transfer time and per-op
    overhead: what the schedule should have cost given this step's imbalance, transfers and overhead."""
    evs = stage_events(events)
    fwd, bwd = op_ms(evs, stages, micro_batches)
    p2p = estimate_p2p_ms(evs) if p2p_ms is None else p2p_ms
    overhead = estimate_overhead_ms(evs, p2p) if overhead_ms is None else overhead_ms
    return replay_schedule(schedule, stages, micro_batches, fwd, bwd, p2p, overhead)


@dataclass(frozen=True)
class BubbleBreakdown:
    """Pipeline bubble (1 - sum busy / sum step) seen from theory to measurement, each step adding
    one cause: equal stages -> each op's measured time (imbalance) -> transfers -> per-op overhead."""

    theory: float
    """Equal stages, free transfers: (N-1)/(N+M-1)."""
    replay_balanced: float
    """Replay with every op at the mean measured time (equals the theory: a check)."""
    replay_imbalance: float
    """Replay with each op's measured time, free transfers, no overhead."""
    replay_transfers: float
    """... plus the estimated transfer time per hand-off."""
    replay_overhead: float
    """... plus the estimated per-op overhead: the full prediction."""
    measured: float
    p2p_ms: float
    overhead_ms: float

    @property
    def from_schedule(self) -> float:
        return self.replay_balanced

    @property
    def from_imbalance(self) -> float:
        return self.replay_imbalance - self.replay_balanced

    @property
    def from_transfers(self) -> float:
        return self.replay_transfers - self.replay_imbalance

    @property
    def from_overhead(self) -> float:
        return self.replay_overhead - self.replay_transfers

    @property
    def unexplained(self) -> float:
        """Measured minus the full replay: time in the step outside the ops' chain (schedule set-up,
        the closing sync), jitter, clock effects."""
        return self.measured - self.replay_overhead


def explain_bubble(events: Iterable, schedule: str, stages: int, micro_batches: int,
                   window_ms: float | Mapping | tuple | None = None, p2p_ms: float | None = None,
                   overhead_ms: float | None = None) -> BubbleBreakdown:
    """Theory, the replays and the measurement of one step's events side by side (BubbleBreakdown).
    `window_ms` as in `stage_times`."""
    evs = stage_events(events)
    fwd, bwd = op_ms(evs, stages, micro_batches)
    p2p = estimate_p2p_ms(evs) if p2p_ms is None else p2p_ms
    overhead = estimate_overhead_ms(evs, p2p) if overhead_ms is None else overhead_ms
    mean_f = sum(map(sum, fwd)) / (stages * micro_batches)
    mean_b = sum(map(sum, bwd)) / (stages * micro_batches)
    times = stage_times(evs, window_ms, stages)
    measured = 1.0 - sum(t.busy_ms for t in times.values()) / max(sum(t.window_ms for t in times.values()), 1e-12)

    def replay(f, b, p, o):
        return replay_schedule(schedule, stages, micro_batches, f, b, p, o).pipeline_bubble

    return BubbleBreakdown(
        theory=theoretical_bubble(schedule, stages, micro_batches),
        replay_balanced=replay(mean_f, mean_b, 0.0, 0.0),
        replay_imbalance=replay(fwd, bwd, 0.0, 0.0),
        replay_transfers=replay(fwd, bwd, p2p, 0.0),
        replay_overhead=replay(fwd, bwd, p2p, overhead),
        measured=measured, p2p_ms=p2p, overhead_ms=overhead,
    )
