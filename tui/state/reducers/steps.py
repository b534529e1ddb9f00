"""The cross-rank step history behind the Overview's charts: one point per step once every live
rank reported it (or once it is too far behind), with the slowest rank's time, the median and the
mean loss."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from itertools import islice

from ringtop.metrics.numerics import SPIKE_WINDOW, Spike, loss_spike
from ringtop.protocol import Event

STEP_LAG = 8
"""A step is closed for the cross-rank chart once every live rank reported it, or once some rank
is this many steps ahead (a silent rank must not stall the chart)."""
MAX_PENDING_STEPS = 64


@dataclass(frozen=True)
class StepPoint:
    """One step across ranks, for the step-time and loss charts."""

    step: int
    max_ms: float
    median_ms: float
    max_rank: int
    loss: float
    """Mean of the ranks' losses at this step."""
    ranks: int
    grad_norm: float = math.nan
    """The global gradient norm before clipping (one number per step: every rank reports the same)."""


@dataclass(frozen=True)
class LossSpike:
    step: int
    spike: Spike
    rank: int | None = None
    """The rank it is on: the rank's own (an agent's `loss_spike` event, against its own recent
    losses), or, found in the ranks' mean loss, the rank with the highest loss at that step."""
    own: bool = False
    """Found by the rank against its own losses (not diluted into the mean)."""


def spike_of_event(msg: Event) -> LossSpike | None:
    """A rank's `loss_spike` event (agent/health/step_findings.py) as the health line shows it."""
    d = msg.data if isinstance(msg.data, dict) else {}
    loss, median, z, rank = d.get("loss"), d.get("median"), d.get("z"), d.get("rank", msg.rank)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (loss, median)):
        return None
    z = float(z) if isinstance(z, (int, float)) and not isinstance(z, bool) else math.nan
    return LossSpike(msg.step, Spike(float(loss), float(median), z),
                     rank if isinstance(rank, int) and not isinstance(rank, bool) else msg.rank, own=True)


def _complete(got: dict[int, tuple], live: set[int]) -> bool:
    """Every live rank reported the step. The count is tested first, so the set test over all
    ranks runs only once the step can be complete (about once per step, not once per message):
    at 4096 ranks a Step cost 31 µs to fold in with the set test on every message, O(ranks)."""
    return len(got) >= len(live) and live.issubset(got)


class StepHistory:
    def __init__(self, points: int) -> None:
        self.points: deque[StepPoint] = deque(maxlen=points)
        self.last_spike: LossSpike | None = None
        """The latest step whose mean loss was a spike against the steps before it."""
        self._pending: dict[int, dict[int, tuple[float, float, float]]] = {}
        self._newest_step = -1
        self._oldest: int | None = None
        """The oldest pending step, as of the last close."""
        self._live_at_close = -1
        """Live ranks at the last close (-1: look again at the next message)."""
        self._drawn_step: int | None = None
        """The newest step drawn in this attempt of the run: a later message of it or of an older
        one is a late rank's."""

    def restart(self) -> None:
        """The run started again (its launcher restarted it): its steps count from where the new
        attempt resumes, maybe below the points already drawn, which stay."""
        self._pending.clear()
        self._newest_step = -1
        self._drawn_step = None
        self._oldest = None
        self._live_at_close = -1

    def collect(self, step: int, rank: int, step_ms: float, loss: float, live: set[int],
                grad_norm: float = math.nan) -> None:
        if self._drawn_step is not None and step <= self._drawn_step:
            return  # already closed (a late rank); its own row still shows it
        got = self._pending.get(step)
        if got is None:
            self._pending[step] = {rank: (step_ms, loss, grad_norm)}
        else:
            got[rank] = (step_ms, loss, grad_norm)
            if self._live_at_close == len(live) and (step != self._oldest or len(got) < len(live)):
                # another rank of a pending step: the newest step, the pending steps and who is live
                # are as at the last close, so only the oldest step can close, once it can be complete
                return
        if step > self._newest_step:
            self._newest_step = step
        self._close_ready(live)

    def _close_ready(self, live: set[int]) -> None:
        for s in sorted(self._pending):  # a few steps at most (STEP_LAG)
            got = self._pending[s]
            if s <= self._newest_step - STEP_LAG or len(self._pending) > MAX_PENDING_STEPS or _complete(got, live):
                self._close(s, self._pending.pop(s))
            else:
                break
        self._oldest = min(self._pending, default=None)
        self._live_at_close = len(live)

    def close_complete(self, live: set[int]) -> None:
        """A rank that left must not hold open the cross-rank chart."""
        for s in sorted(self._pending):
            if _complete(self._pending[s], live):
                self._close(s, self._pending.pop(s))
            else:
                break
        self._oldest = min(self._pending, default=None)
        self._live_at_close = -1

    def forget_rank(self, rank: int) -> None:
        for points in self._pending.values():
            points.pop(rank, None)
        self._live_at_close = -1

    def _close(self, step: int, got: dict[int, tuple[float, float, float]]) -> None:
        times = {r: ms for r, (ms, _, _) in got.items() if math.isfinite(ms)}
        losses = [lo for _, lo, _ in got.values() if math.isfinite(lo)]
        norms = [g for _, _, g in got.values() if math.isfinite(g)]
        if not times:
            return
        self._drawn_step = step
        max_rank = max(times, key=times.__getitem__)
        loss = sum(losses) / len(losses) if losses else math.nan
        recent = [p.loss for p in islice(reversed(self.points), SPIKE_WINDOW)][::-1]
        spike = loss_spike(recent, loss)
        own = self.last_spike is not None and self.last_spike.own and self.last_spike.step == step
        if spike is not None and not own:  # a rank's own finding of this step says more
            ranked = sorted(((lo, r) for r, (_, lo, _) in got.items() if math.isfinite(lo)), reverse=True)
            alone = len(ranked) == 1 or ranked[0][0] > ranked[1][0]  # a tie names no rank
            self.last_spike = LossSpike(step, spike, ranked[0][1] if alone else None)
        self.points.append(StepPoint(
            step=step,
            max_ms=times[max_rank],
            median_ms=statistics.median(times.values()),
            max_rank=max_rank,
            loss=loss,
            ranks=len(got),
            grad_norm=max(norms) if norms else math.nan,
        ))
