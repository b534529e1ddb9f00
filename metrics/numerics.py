"""Loss spikes: a step's loss against the recent ones, by a robust z-score (median and MAD), so
that one earlier spike does not hide the next, and the noise of a healthy run raises nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ringtop.metrics.rules.outliers import median

MAD_TO_SIGMA = 1.4826
"""MAD × this estimates the standard deviation of normally distributed values."""
SPIKE_WINDOW = 50
SPIKE_MIN_POINTS = 20
SPIKE_Z = 6.0
"""A loss this many robust standard deviations above the window's median is a spike."""


@dataclass(frozen=True, slots=True)
class Spike:
    loss: float
    median: float
    z: float


def robust_z(x: float, window: Sequence[float]) -> float:
    """(x − median) / (1.4826 × MAD) of the finite values of `window`; NaN with none, and ±inf
    when they are all equal and `x` is not."""
    values = [v for v in window if math.isfinite(v)]
    if not values or not math.isfinite(x):
        return math.nan
    m = median(values)
    mad = median(abs(v - m) for v in values)
    if mad == 0:
        return 0.0 if x == m else math.copysign(math.inf, x - m)
    return (x - m) / (MAD_TO_SIGMA * mad)


def loss_spike(previous: Sequence[float], loss: float, *, window: int = SPIKE_WINDOW,
               min_points: int = SPIKE_MIN_POINTS, z: float = SPIKE_Z) -> Spike | None:
    """`loss` as a spike against the last `window` finite losses before it; None while fewer than
    `min_points` are known, or when it is not `z` robust deviations above their median."""
    recent = [v for v in previous if math.isfinite(v)][-window:]
    if len(recent) < min_points or not math.isfinite(loss):
        return None
    score = robust_z(loss, recent)
    if not score >= z:
        return None
    return Spike(loss=loss, median=median(recent), z=score)
