"""What one rank finds in its own published steps, as events (the logs, the Events tab, `summary`):
a loss spike against this rank's own recent losses (a spike on one rank is named on that rank,
not diluted into the ranks' mean), and a TFLOP/s figure above the most its device can do (the
tokens or FLOPs it was computed from are wrong). Off the step path: it reads numbers already on
the host when a step is published."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

from ringtop.metrics import fmt
from ringtop.metrics.numerics import SPIKE_WINDOW, loss_spike
from ringtop.metrics.rules.peaks import Peak, implausible

SPIKE_QUIET_STEPS = SPIKE_WINDOW
"""After a spike, the next one is reported only this many steps later (a diverging run spikes
every step; one event says it)."""


@dataclass(frozen=True)
class Finding:
    level: str
    kind: str
    text: str
    step: int
    data: dict[str, Any]


class StepFindings:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ceiling = Peak(0.0, "")
        """The most TFLOP/s this rank could do (metrics/rules/peaks.py tflops_ceiling); 0: not known."""
        self._losses: collections.deque[float] = collections.deque(maxlen=SPIKE_WINDOW)
        self._last_spike_step = -SPIKE_QUIET_STEPS
        self._flagged_tflops = False

    def observe(self, step: int, loss: float, tflops: float) -> list[Finding]:
        found = []
        spike = loss_spike(self._losses, loss) if math.isfinite(loss) else None
        if spike is not None and step - self._last_spike_step >= SPIKE_QUIET_STEPS:
            self._last_spike_step = step
            found.append(Finding(
                "warn", "loss_spike",
                f"loss spike on rank {self.rank} at step {step:,}: {fmt.loss(spike.loss)} against a median "
                f"{fmt.loss(spike.median)} of its last {len(self._losses)} steps"
                + (f" ({spike.z:.0f} robust σ)" if math.isfinite(spike.z) else ""),
                step, {"rank": self.rank, "step": step, "loss": spike.loss, "median": spike.median,
                       "z": round(spike.z, 1) if math.isfinite(spike.z) else None}))
        if math.isfinite(loss):
            self._losses.append(loss)
        if not self._flagged_tflops and implausible(tflops, self.ceiling.tflops):
            self._flagged_tflops = True
            found.append(Finding(
                "warn", "implausible_tflops",
                f"rank {self.rank} at step {step:,}: {fmt.tflops(tflops)} TFLOP/s is above "
                f"{self.ceiling.source}, {fmt.tflops(self.ceiling.tflops)} TFLOP/s: not a measurement; the tokens "
                "or FLOPs per step it was computed from are wrong",
                step, {"rank": self.rank, "step": step, "tflops": tflops, "ceiling_tflops": self.ceiling.tflops}))
        return found
