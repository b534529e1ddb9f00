"""Is B different from A? One reading's difference between two runs, judged against each run's own
step-to-step variation. Pure and torch-free: `ringtop diff` feeds it the logs' numbers.

The test: Welch's t-test (unequal variances), two-sided, on the medians of consecutive blocks of
`BLOCK_STEPS` steps. Steps of one run are not independent (a slow minute slows many steps in a
row): block values are much closer to independent, so the p-value is not overstated by counting
every step as a sample, and a block's median is not moved by one stalled step. The step time is
the primary reading, tested alone; the p-values of the other timed readings (the phases, rates,
collectives, each rank's compute) are Holm-adjusted together (a dozen readings tested at once
would otherwise find a "difference" between identical runs one time in ten). A timed difference
is *significant* when its adjusted p < `ALPHA` and it moves by at least `MIN_REL` of A's value, or
for a part of the step (a phase, a collective's time, a rank's compute) by `MIN_REL` of A's step
time: a shared machine drifts by a few per cent between runs, and a 5 ms phase that moves by
0.3 ms is not what anyone changed.
Counted readings (bytes, calls, memory) have no noise of their own: they differ or they do not.
Each run's warm-up is left out first (`settled_from`): the steps before it settles are slow by
design (caches, buckets, autotuning) and would swamp any test.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_STEPS = 5
ALPHA = 0.01
MIN_REL = 0.05
MIN_BLOCKS = 2
"""Fewer blocks than this on a side and no test is made: too few steps to tell."""
WARMUP_MAD = 3.0
"""A leading step slower than the rest's median by this many (scaled) MADs is still warming up."""


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True)
class Welch:
    t: float
    df: float
    p: float


def welch(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """Welch's t-test of mean(b) - mean(a); None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0.0:
        return Welch(math.inf if diff else 0.0, math.inf, 0.0 if diff else 1.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va * va / (len(a) - 1) if va else 0.0) + (vb * vb / (len(b) - 1) if vb else 0.0))
    return Welch(t, df, t_two_sided_p(t, df))


def block_medians(values: Sequence[float], block: int = BLOCK_STEPS) -> list[float]:
    """Medians of consecutive whole blocks of `block` values (a partial last block is left out)."""
    return [statistics.median(values[i:i + block]) for i in range(0, len(values) - block + 1, block)]


def settled_from(step_ms: Sequence[float], most: float = 0.5) -> int:
    """How many leading steps are warm-up: those slower than the median of the steps after them by
    more than `WARMUP_MAD` scaled MADs, at most `most` of the run."""
    n = 0
    limit = int(len(step_ms) * most)
    while n < limit:
        rest = step_ms[n + 1:]
        med = statistics.median(rest)
        mad = 1.4826 * statistics.median(abs(x - med) for x in rest)
        if step_ms[n] <= med + WARMUP_MAD * max(mad, 0.02 * med):
            break
        n += 1
    return n


@dataclass(frozen=True)
class Difference:
    """One reading of A against B."""

    name: str
    unit: str
    a: float
    b: float
    p: float | None
    """Welch's p on block means; None for a counted reading or too few steps."""
    significant: bool
    counted: bool = False
    shifted: bool = False
    """The shift is at least MIN_REL of A's value (a timed reading's practical floor)."""

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def rel(self) -> float:
        """(B - A) / A; NaN when A is 0."""
        return self.delta / self.a if self.a else (math.nan if self.delta else 0.0)

    @property
    def judgement(self) -> str:
        if self.counted:
            return "differs" if self.significant else "same"
        if self.p is None:
            return "too few steps"
        return "significant" if self.significant else "within noise"


def timed(name: str, unit: str, a: Sequence[float], b: Sequence[float], block: int = BLOCK_STEPS,
          alpha: float = ALPHA, min_rel: float = MIN_REL, min_shift: float | None = None) -> Difference | None:
    """A noisy per-step reading (times, rates): significant by Welch's test on block medians and a
    shift of at least `min_rel` of A's value, or of `min_shift` where given (a part of the step:
    MIN_REL of the step time). None when a side has no finite value."""
    a = [x for x in a if math.isfinite(x)]
    b = [x for x in b if math.isfinite(x)]
    if not a or not b:
        return None
    ma, mb = statistics.median(a), statistics.median(b)
    if min_shift is not None:
        big_enough = abs(mb - ma) >= min_shift
    else:
        big_enough = abs(mb - ma) >= min_rel * abs(ma) if ma else mb != ma
    test = welch(block_medians(a, block), block_medians(b, block))
    if test is None or len(a) < MIN_BLOCKS * block or len(b) < MIN_BLOCKS * block:
        return Difference(name, unit, ma, mb, None, False, shifted=big_enough)
    return Difference(name, unit, ma, mb, test.p, test.p < alpha and big_enough, shifted=big_enough)


def holm(diffs: Sequence[Difference], alpha: float = ALPHA) -> list[Difference]:
    """The timed readings of one comparison with Holm-adjusted p-values and significance redone on
    them (counted readings and untested ones pass through)."""
    tested = sorted((d.p, i) for i, d in enumerate(diffs) if not d.counted and d.p is not None)
    m = len(tested)
    adjusted: dict[int, float] = {}
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        adjusted[i] = running
    out = []
    for i, d in enumerate(diffs):
        if i in adjusted:
            d = Difference(d.name, d.unit, d.a, d.b, adjusted[i], adjusted[i] < alpha and d.shifted, shifted=d.shifted)
        out.append(d)
    return out


def counted(name: str, unit: str, a: float, b: float, rel_tolerance: float = 0.0) -> Difference:
    """A reading without noise of its own (bytes, calls per step, memory): it differs or not."""
    differs = abs(b - a) > rel_tolerance * max(abs(a), abs(b))
    return Difference(name, unit, a, b, None, differs, counted=True)


def p_text(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
