"""The one rule for "this rank is slower than the others": the rank's time against the median of
the *other* ranks (the slow rank must not pull up its own baseline; with two ranks the median of
all would be the midpoint and halve the excess).

The slowest rank is picked on compute time (metrics.timing.compute_ms: the step less its waits)
everywhere: the UI's one reading (RunView.slowest: the Overview's ▲, its health and alert lines,
the Comm tab) and the agent's straggler verdict. Ranks in lockstep have equal step times; the slow
one is the one the others wait for, so a rank's step time would put the marker on whichever rank
waited longest. How far above the others a rank must be depends on what is done with it, so each
use names its `Threshold` below; the rule that applies it is the same.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True, slots=True)
class Threshold:
    """How far above the others' median a rank must be to be called out: both by this percentage
    and by this much in the compared value's own unit (ms for times: the floor keeps a few ms of
    jitter on fast steps from counting)."""

    min_excess_pct: float
    min_excess: float = 0.0


SLOWEST_SHOWN = Threshold(min_excess_pct=10.0)
"""Mark and name the slowest rank by compute, on every screen alike (the ranks table's ▲, the
health and alert lines, the Comm tab and its verdict panel): compute is the step minus the waits,
a smaller figure than the step, so the same jitter in ms is a larger percentage; one threshold, so
that no screen names a rank another leaves unmarked."""
STRAGGLER = Threshold(min_excess_pct=50.0, min_excess=25.0)
"""Raise a `straggler` verdict with advice (the agent's diagnosis): loose on purpose, a healthy run
on a noisy machine must produce none."""
CELL_TIME = Threshold(min_excess_pct=25.0, min_excess=5.0)
"""Highlight a rank's step time in the ranks table: a quarter above the others and 5 ms."""
CELL_SHARE = Threshold(min_excess_pct=25.0, min_excess=5.0)
"""Highlight a rank's idle share (percent of its step): a quarter above the others and 5 points
(17.6 % against 31.7 % is one; 1.0 % against 1.6 % is jitter)."""
CELL_MEMORY = Threshold(min_excess_pct=20.0, min_excess=64 * 2**20)
"""Highlight a rank's memory (bytes): a fifth above the others and 64 MiB (a rank holding more
than its share: uneven pipeline stages, a leak, a rank that gathered what others did not)."""


@dataclass(frozen=True, slots=True)
class Outlier:
    rank: int
    value_ms: float
    others_median_ms: float
    excess_pct: float
    """100 x (value / others' median - 1); inf when the others' median is 0 and this rank's is not."""

    @property
    def excess_ms(self) -> float:
        return self.value_ms - self.others_median_ms

    def meets(self, threshold: Threshold) -> bool:
        return self.excess_pct >= threshold.min_excess_pct and self.excess_ms >= threshold.min_excess


def median(values: Iterable[float]) -> float:
    """The middle value (the mean of the middle two for an even count); NaN for none."""
    xs = sorted(values)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def excess_pct(value_ms: float, baseline_ms: float) -> float:
    """How much larger `value_ms` is than `baseline_ms`, in percent."""
    if baseline_ms > 0:
        return 100.0 * (value_ms / baseline_ms - 1.0)
    return math.inf if value_ms > baseline_ms else 0.0


def against_others(times_ms: Mapping[int, float], rank: int) -> Outlier:
    """`rank`'s time against the median of the other ranks' (finite) times."""
    value = times_ms[rank]
    others = median(t for r, t in times_ms.items() if r != rank and math.isfinite(t))
    return Outlier(rank, value, others, excess_pct(value, others))


def slowest(times_ms: Mapping[int, float]) -> Outlier | None:
    """The rank with the largest finite time (the higher rank on a tie) against the others; None
    with fewer than two finite times. Whether it is slow enough to show is `Outlier.meets`."""
    finite = {r: t for r, t in times_ms.items() if math.isfinite(t)}
    if len(finite) < 2:
        return None
    return against_others(finite, max(finite, key=lambda r: (finite[r], r)))


def outliers(times_ms: Mapping[int, float], threshold: Threshold) -> list[Outlier]:
    """Every rank that meets `threshold` against the others, in rank order (two slow ranks of four
    are both stragglers). The slowest rank is among them whenever any is: removing the largest
    time leaves the smallest median."""
    finite = {r: t for r, t in times_ms.items() if math.isfinite(t)}
    if len(finite) < 2:
        return []
    found = (against_others(finite, r) for r in sorted(finite))
    return [o for o in found if o.meets(threshold)]


# ---------------------------------------------------------------------- many ranks: a robust rule

MAD_Z_FLAG = 3.5
"""Flag a rank whose robust z (modified z-score, Iglewicz & Hoaglin) is at least this."""
MAD_SCALE = 0.6745
"""The normal distribution's MAD is 0.6745 σ: 0.6745·(x − median)/MAD reads like a z-score."""
MEAN_AD_SCALE = 1.253314
"""When MAD is 0 (more than half the ranks tie), the mean absolute deviation stands in for it:
(x − median)/(1.253314·MeanAD), √(π/2) being MeanAD's own factor to σ."""


def robust_z(values: Mapping[int, float]) -> dict[int, float]:
    """Per rank, how far its (finite) value lies from the median in robust units:
    0.6745·(x − median)/MAD. Unlike a rule against the others' median (`slowest`, `outliers`),
    one slow rank among a thousand moves neither the median nor the MAD, and jitter that is common
    to every rank scales the unit. MAD = 0: (x − median)/(1.253314·MeanAD); both 0 (every value
    equal): every z is 0."""
    finite = {r: v for r, v in values.items() if math.isfinite(v)}
    if not finite:
        return {}
    mid = median(finite.values())
    dev = [abs(v - mid) for v in finite.values()]
    mad = median(dev)
    if mad > 0:
        unit = mad / MAD_SCALE
    else:
        unit = MEAN_AD_SCALE * sum(dev) / len(dev)
    if unit <= 0:
        return dict.fromkeys(finite, 0.0)
    return {r: (v - mid) / unit for r, v in finite.items()}


def mad_outliers(values: Mapping[int, float], flag: float = MAD_Z_FLAG,
                 floor: Threshold | None = None) -> list[tuple[int, float]]:
    """(rank, robust z) of the ranks above the median by at least `flag` robust units, the
    farthest first (then by rank). `floor`, when given, also asks for that much above the median
    (a spread of a tenth of a millisecond makes 1 ms a large z, but no finding)."""
    z = robust_z(values)
    if not z:
        return []
    mid = median(v for v in values.values() if math.isfinite(v))
    found = []
    for r, zr in z.items():
        if zr < flag:
            continue
        if floor is not None and not (excess_pct(values[r], mid) >= floor.min_excess_pct
                                      and values[r] - mid >= floor.min_excess):
            continue
        found.append((r, zr))
    return sorted(found, key=lambda p: (-p[1], p[0]))


def top_k(values: Mapping[int, float], k: int) -> list[tuple[int, float]]:
    """The `k` largest finite values as (rank, value), largest first, the lower rank on a tie."""
    finite = ((r, v) for r, v in values.items() if math.isfinite(v))
    return heapq.nsmallest(max(0, k), finite, key=lambda p: (-p[1], p[0]))
