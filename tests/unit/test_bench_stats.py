"""The statistics of benchmarks/bench_agent_overhead.py (benchmarks/_block_stats.py): the ABBA order,
which steps a block keeps, the pairing, and the ratios' intervals, on synthetic step times shaped
like this machine's (a step time that drifts from 150 to 280 ms, in spells, with bursts)."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_block_stats.py"
_spec = importlib.util.spec_from_file_location("bench_block_stats", PATH)
stats = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = stats  # dataclasses look their module up while it loads
_spec.loader.exec_module(stats)

BLOCK, WARMUP, SKIP, PAIRS = 2, 8, 1, 300
"""bench_agent_overhead.py's defaults."""


def drifting_steps(n: int, overhead: float, seed: int, block: int = BLOCK) -> list[float]:
    """Step times in ms: a base drifting linearly from 150 to 280 ms, spells (an AR(1) in log space,
    correlation 0.8 step to step), bursts of 10-40 steps 50 % slower, 5 % noise of each step's own;
    the steps of arm A multiplied by `overhead`."""
    rng = random.Random(seed)
    spell, burst, out = 0.0, 0, []
    for i in range(n):
        spell = 0.8 * spell + rng.gauss(0, 0.06)
        if burst == 0 and rng.random() < 0.01:
            burst = rng.randint(10, 40)
        slow = 0.4 if burst else 0.0
        burst = max(0, burst - 1)
        ms = (150 + 130 * i / n) * math.exp(spell + slow + rng.gauss(0, 0.05))
        out.append(ms * (overhead if stats.step_is_a(i + 1, block) else 1.0))
    return out


def ratios_of(step_ms: list[float], block: int = BLOCK, warmup: int = WARMUP, skip: int = SKIP) -> list[float]:
    return [a.median_ms / b.median_ms for a, b in stats.pairs_of(stats.blocks_of(step_ms, block, warmup, skip))]


def test_runs_alternate_abba_and_steps_in_quartets_abba_or_baab_by_the_step_number_alone():
    assert [stats.block_is_a(b, seed=None) for b in range(8)] == [True, False, False, True] * 2
    abba, baab = (True, False, False, True), (False, True, True, False)
    quartets = [tuple(stats.block_is_a(4 * q + i) for i in range(4)) for q in range(64)]
    assert set(quartets) == {abba, baab}
    assert 16 < quartets.count(abba) < 48, "both orientations, about as often"
    assert [stats.step_is_a(s, 2) for s in range(1, 129)] == [stats.step_is_a(s, 2) for s in range(1, 129)]
    assert [stats.step_is_a(s, 2) for s in range(1, 129)] != [stats.step_is_a(s, 2, seed=1) for s in range(1, 129)]
    assert [stats.step_is_a(s, 3, seed=None) for s in range(1, 7)] == [True] * 3 + [False] * 3


def test_a_block_keeps_its_steps_after_the_first_and_drops_warmup_and_a_cut_block():
    # step value: 100 + 10 x block + position; each block's first step 1000 (the previous arm's leftovers)
    block, warmup = 3, 4
    step_ms = [1000.0 if i % block == 0 else 100.0 + 10 * (i // block) + i % block for i in range(8 * block + 2)]
    blocks = stats.blocks_of(step_ms, block, warmup, skip_first=1, seed=None)
    assert [b.index for b in blocks] == [4, 5, 6, 7]  # warm-up 0-3 dropped; block 8 cut short
    assert [b.median_ms for b in blocks] == [100 + 10 * b + 1.5 for b in (4, 5, 6, 7)]
    assert [b.a for b in blocks] == [True, False, False, True]
    kept_first = stats.blocks_of(step_ms, block, warmup, skip_first=0, seed=None)
    assert [b.median_ms for b in kept_first] != [b.median_ms for b in blocks], "the first step must be dropped"
    with pytest.raises(ValueError):
        stats.blocks_of(step_ms, block, 2)  # half a quartet of warm-up would split the quartets


def test_pairs_join_neighbouring_blocks_a_first():
    blocks = stats.blocks_of([float(i) for i in range(1, 13)], 2, 0, 0, seed=None)
    assert [(a.index, b.index) for a, b in stats.pairs_of(blocks)] == [(0, 1), (3, 2), (4, 5)]
    assert stats.pairs_of(blocks[:-1])[-1][0].index == 3, "a pair missing a block is left out"


@pytest.mark.parametrize("seed", [None, 0])
def test_quartets_cancel_a_linear_drift_where_a_fixed_order_does_not(seed):
    block, n = 4, 400
    step_ms = [150 + 130 * i / n for i in range(n)]  # 150 -> 280 ms, no overhead, no noise
    ratios = [a.median_ms / b.median_ms for a, b in stats.pairs_of(stats.blocks_of(step_ms, block, 0, 1, seed))]
    assert abs(stats.t_ratio(ratios).ratio - 1) < 1e-4
    assert abs(stats.trimmed_ratio(ratios, resamples=200).ratio - 1) < 1e-3
    blocks = stats.blocks_of(step_ms, block, 0, 1, seed)
    fixed_order = [blocks[i].median_ms / blocks[i + 1].median_ms for i in range(0, len(blocks) - 1, 2)]  # ABAB
    assert abs(stats.t_ratio(fixed_order).ratio - 1) > 0.003, "the drift check must be able to fail"


@pytest.mark.parametrize("estimate", ["trimmed", "t"])
def test_the_interval_resolves_3_percent_and_holds_1_for_none(estimate):
    n = (WARMUP + 2 * PAIRS) * BLOCK
    interval = ((lambda r: stats.trimmed_ratio(r, resamples=2000)) if estimate == "trimmed" else stats.t_ratio)
    with_overhead = interval(ratios_of(drifting_steps(n, 1.03, seed=1)))
    assert 1.0 < with_overhead.low and with_overhead.low <= 1.03 <= with_overhead.high
    assert with_overhead.pairs == PAIRS
    without = interval(ratios_of(drifting_steps(n, 1.0, seed=1)))
    assert without.low <= 1.0 <= without.high
    assert without.half_width < 0.02, "at the defaults, the interval is a couple of percent wide at most"


def test_random_quartets_keep_a_step_periodic_cost_off_one_arm_where_abba_throughout_does_not():
    """A/A: both arms the same, one step in 8 (steps 8, 16, ...) 10 % slower; that step is always an
    A block's measured step in ABBA throughout (blocks of 2, the first step of each left out)."""
    n = (WARMUP + 2 * PAIRS) * BLOCK
    rng = random.Random(3)
    step_ms = [150 * math.exp(rng.gauss(0, 0.05)) * (1.1 if (i + 1) % 8 == 0 else 1.0) for i in range(n)]

    def interval(seed):
        blocks = stats.blocks_of(step_ms, BLOCK, WARMUP, SKIP, seed)
        return stats.t_ratio([a.median_ms / b.median_ms for a, b in stats.pairs_of(blocks)])

    assert interval(None).low > 1.01, "the check must be able to fail: ABBA throughout aliases the period"
    assert interval(0).low <= 1.0 <= interval(0).high


def test_the_t_interval_covers_95_percent_and_a_normal_quantile_would_not(monkeypatch):
    rng = random.Random(7)
    samples = [[math.exp(rng.gauss(0.01, 0.05)) for _ in range(5)] for _ in range(3000)]

    def coverage() -> float:
        return sum(ci.low <= math.exp(0.01) <= ci.high for ci in map(stats.t_ratio, samples)) / len(samples)

    assert 0.93 < coverage() < 0.97
    monkeypatch.setattr(stats, "t975", lambda df: stats.Z975)
    assert coverage() < 0.9, "with 5 pairs a z-interval is too narrow: the coverage check must see it"


def test_t975_is_continuous_past_its_table():
    assert stats.Z975 < stats.t975(31) < stats.t975(30) < stats.t975(29)
    assert abs(stats.t975(31) - stats.t975(30)) < 0.005
