"""Paired blocks: a ratio of about 1 % told from a machine whose step time drifts by tens of percent.

Two arms alternate in blocks (of steps inside one run, or of whole runs): blocks pair up as (0, 1),
(2, 3), ...; pairs as quartets, ABBA or BAAB (`block_is_a`), so a drift that is linear over a
quartet charges both arms alike. Each pair gives one ratio A / B of its two blocks' medians
(neighbours in time: little drift between them).

Two ways to put the ratios together, each with a 95 % confidence interval:

- `trimmed_ratio` (many pairs: blocks of steps): the 20 %-trimmed mean of the log-ratios, its
  interval a percentile bootstrap over pairs (fixed seed). A burst of load from another process
  lands in one pair and makes it an outlier; trimming drops such pairs and keeps nearly all of a
  mean's precision when there are none.
- `t_ratio` (few pairs: whole runs): the mean log-ratio ± t(0.975, n - 1) × its standard error. A
  bootstrap of a handful of pairs claims more certainty than it has.

Both are turned back into ratios through exp. Pure functions, no torch: `bench_agent_overhead.py`
and `_telemetry_blocks.py` use them, tests/unit/test_bench_stats.py checks them.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
"""Student's t, 0.975 quantile, for 1 to 30 degrees of freedom (the printed tables')."""
Z975 = 1.959964
TRIM = 0.2
RESAMPLES = 4000
SEED = 0


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


_MASK = (1 << 64) - 1


def _hash_bit(n: int) -> bool:
    """One bit of splitmix64(n): the same on every rank and run, no state."""
    z = (n + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return bool((z ^ (z >> 31)) & 1)


def block_is_a(block: int, seed: int | None = SEED) -> bool:
    """Whether block `block` runs arm A. Blocks come in quartets (4q .. 4q + 3), each ABBA or,
    where a hash of (`seed`, q) says so, BAAB: either cancels a linear drift within the quartet,
    and the random orientation keeps work that recurs every so many steps (rules every 20 steps,
    the allocator's and garbage collector's cycles) from landing on one arm more than the other,
    as it can in a fixed pattern (an A/A run, both arms the same, gave 1.014 with ABBA throughout).
    `seed` None: ABBA throughout (whole runs: too few to randomize)."""
    quartet, position = divmod(block, 4)
    a = position in (0, 3)
    return a if seed is None else a != _hash_bit(quartet * 0x10001 + seed)


def step_is_a(step: int, block_steps: int, seed: int | None = SEED) -> bool:
    """Whether step `step` (counted from 1) runs arm A, blocks of `block_steps` steps."""
    return block_is_a((step - 1) // block_steps, seed)


@dataclass
class Block:
    index: int
    a: bool
    """Arm A (the one under test) ran in this block."""
    median_ms: float
    steps: int
    """Steps measured (a block's first is left out: see `blocks_of`)."""


def blocks_of(step_ms: list[float], block_steps: int, warmup_blocks: int, skip_first: int = 1,
              seed: int | None = SEED) -> list[Block]:
    """Each block's median step time; `step_ms[i]` is step i + 1's.

    The first `skip_first` steps of each block are left out: what a step leaves to other threads
    (its telemetry sent and relayed) runs during the next one, so a block's first step still
    carries some of the previous block's arm. The first `warmup_blocks` blocks, and a last block
    cut short, are left out too."""
    if warmup_blocks % 4:
        raise ValueError("warm-up is whole quartets of blocks (a multiple of 4), so each quartet stays whole")
    if not 0 <= skip_first < block_steps:
        raise ValueError("a block must keep at least one step")
    by_block: dict[int, list[float]] = {}
    for i, ms in enumerate(step_ms):
        block, position = divmod(i, block_steps)
        if block >= warmup_blocks and position >= skip_first:
            by_block.setdefault(block, []).append(ms)
    kept = block_steps - skip_first
    return [Block(b, block_is_a(b, seed), statistics.median(ms), len(ms)) for b, ms in sorted(by_block.items())
            if len(ms) == kept]


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
    low: float
    high: float
    pairs: int
    method: str

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def as_dict(self) -> dict[str, float | int | str]:
        return {"ratio": round(self.ratio, 4), "ci95_low": round(self.low, 4), "ci95_high": round(self.high, 4),
                "ci95_half_width": round(self.half_width, 4), "pairs": self.pairs, "method": self.method}


def trimmed_mean(xs: list[float], trim: float = TRIM) -> float:
    """The mean of `xs` without its lowest and highest `trim` fraction (rounded down)."""
    k = int(len(xs) * trim)
    kept = sorted(xs)[k:len(xs) - k]
    return statistics.fmean(kept)


def trimmed_ratio(ratios: list[float], seed: int = SEED, resamples: int = RESAMPLES,
                  trim: float = TRIM) -> RatioCI:
    """exp(trimmed mean of the log-ratios), 95 % percentile bootstrap over pairs."""
    if len(ratios) < 2:
        raise ValueError("a bootstrap needs at least 2 pairs")
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    n = len(logs)
    draws = sorted(trimmed_mean(rng.choices(logs, k=n), trim) for _ in range(resamples))
    low, high = draws[int(0.025 * resamples)], draws[math.ceil(0.975 * resamples) - 1]
    return RatioCI(math.exp(trimmed_mean(logs, trim)), math.exp(low), math.exp(high), n,
                   f"{trim:.0%}-trimmed mean of the pairs' log-ratios; percentile bootstrap over pairs, "
                   f"{resamples} resamples, seed {seed}")


def t_ratio(ratios: list[float]) -> RatioCI:
    """exp(mean log-ratio) with its 95 % t-interval."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return RatioCI(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n,
                   "mean of the pairs' log-ratios; t-interval")
