"""Paired blocks: a ratio of about 1 % told from a machine whose step time drifts by tens of percent.

Two arms alternate in blocks (of steps inside one run, or of whole runs) in ABBA order: blocks pair
up as (0, 1), (2, 3), ...; an even pair runs arm A first, an odd pair arm B first, so a drift that
is linear over two pairs charges both arms alike. Each pair gives one ratio A / B of its two blocks'
medians (neighbours in time: the drift between them is small); the ratios' 95 % confidence interval
is a t-interval of their logarithms (the mean log-ratio ± t(0.975, n - 1) × its standard error, back
through exp): ratios are multiplicative, and a t-interval needs no random draws.

Pure functions, no torch: `bench_agent_overhead.py` and `_telemetry_blocks.py` use them, and
tests/unit/test_bench_stats.py checks them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
"""Student's t, 0.975 quantile, for 1 to 30 degrees of freedom (the printed tables')."""
Z975 = 1.959964


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t: the table to 30 degrees of freedom, then the
    Cornish-Fisher expansion about the normal quantile (within 1e-4 of the exact value beyond)."""
    if df < 1:
        raise ValueError("a t-interval needs at least 2 pairs")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def block_is_a(block: int) -> bool:
    """ABBA: the first block of an even pair and the second of an odd pair run arm A."""
    pair, second = divmod(block, 2)
    return (second == 0) != (pair % 2 == 1)


def step_is_a(step: int, block_steps: int) -> bool:
    """Whether step `step` (counted from 1) runs arm A, blocks of `block_steps` steps."""
    return block_is_a((step - 1) // block_steps)


@dataclass
class Block:
    index: int
    a: bool
    """Arm A (the one under test) ran in this block."""
    median_ms: float
    mean_ms: float
    steps: int
    """Steps measured (a block's first is left out: see `blocks_from_ends`)."""


def blocks_from_ends(ends_s: list[float], block_steps: int, warmup_blocks: int) -> list[Block]:
    """Block medians from the wall time at the end of each step (`ends_s[i]`: step i + 1's).

    A step's time is the interval from the previous step's end to its own, which also holds the
    previous step's reporting: the first step of a block is therefore a mix of both arms, and is
    left out. The first `warmup_blocks` blocks, and a last block cut short, are left out too."""
    if warmup_blocks % 2:
        raise ValueError("warm-up is whole pairs of blocks (an even number), so the ABBA order holds")
    by_block: dict[int, list[float]] = {}
    for step in range(2, len(ends_s) + 1):
        block, position = divmod(step - 1, block_steps)
        if block >= warmup_blocks and position > 0:
            by_block.setdefault(block, []).append((ends_s[step - 1] - ends_s[step - 2]) * 1e3)
    return [Block(b, block_is_a(b), statistics.median(ms), statistics.fmean(ms), len(ms))
            for b, ms in sorted(by_block.items()) if len(ms) == block_steps - 1]


def pairs_of(blocks: list[Block]) -> list[tuple[Block, Block]]:
    """(A block, B block) of each complete pair, in time order."""
    by_pair: dict[int, list[Block]] = {}
    for b in blocks:
        by_pair.setdefault(b.index // 2, []).append(b)
    out = []
    for _, members in sorted(by_pair.items()):
        a = [b for b in members if b.a]
        other = [b for b in members if not b.a]
        if len(a) == 1 and len(other) == 1:
            out.append((a[0], other[0]))
    return out


@dataclass
class RatioCI:
    ratio: float
    """The geometric mean of the pairs' ratios."""
    low: float
    high: float
    pairs: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def as_dict(self) -> dict[str, float | int]:
        return {"ratio": round(self.ratio, 4), "ci95_low": round(self.low, 4), "ci95_high": round(self.high, 4),
                "ci95_half_width": round(self.half_width, 4), "pairs": self.pairs,
                "method": "t-interval of the mean log-ratio over pairs"}


def ratio_ci(ratios: list[float]) -> RatioCI:
    """The 95 % t-interval of the mean log-ratio, as ratios."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = statistics.fmean(logs)
    se = statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    t = t975(n - 1)
    return RatioCI(math.exp(mean), math.exp(mean - t * se), math.exp(mean + t * se), n)


def paired_ratio(pairs: list[tuple[float, float]]) -> RatioCI:
    """(A, B) values per pair → A / B with its confidence interval."""
    return ratio_ci([a / b for a, b in pairs])
