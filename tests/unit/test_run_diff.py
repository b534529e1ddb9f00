"""metrics/run_diff.py: the t distribution against the printed tables, Welch's test and Holm's
adjustment against hand arithmetic, and the rules that make a difference significant — each with
the case that tells a wrong rule apart."""

from __future__ import annotations

import pytest

from ringtop.metrics import run_diff as rd

# Two-sided critical values of Student's t (any statistics textbook's table): P(|T| >= t) = p.
T_TABLE = [(1, 12.706, 0.05), (5, 2.571, 0.05), (10, 2.228, 0.05), (30, 2.042, 0.05), (4, 4.604, 0.01),
           (10, 3.169, 0.01), (20, 2.845, 0.01), (1_000_000, 1.960, 0.05), (1_000_000, 2.576, 0.01)]

NOISE = [0.0, 3.0, -2.0, 1.0, -1.0, 2.0, -3.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.0, 1.0, -1.0, 3.0, -3.0, 2.0, -2.0]
"""A fixed, mean-zero wiggle of ±3 ms, step to step."""


@pytest.mark.parametrize("df,t,p", T_TABLE)
def test_the_t_distribution_matches_the_printed_table(df, t, p):
    assert rd.t_two_sided_p(t, df) == pytest.approx(p, abs=5e-4)


def test_welch_against_hand_arithmetic():
    # means 3 and 5, variances 2.5 each over n = 5: t = 2 / sqrt(0.5 + 0.5) = 2, df = 1 / (2 * 0.25 / 4) = 8
    w = rd.welch([1, 2, 3, 4, 5], [3, 4, 5, 6, 7])
    assert (w.t, w.df) == (pytest.approx(2.0), pytest.approx(8.0))
    assert w.p == pytest.approx(0.0805, abs=5e-4)  # the table's t = 2.0 at 8 degrees of freedom
    assert rd.welch([1.0], [2.0, 3.0]) is None, "one value has no variance to test against"


def test_holm_against_hand_arithmetic_and_counted_readings_pass_through():
    diffs = [rd.Difference(f"r{i}", "ms", 10, 12, p, p < rd.ALPHA, shifted=True) for i, p in
             enumerate([0.02, 0.001, 0.004])]
    diffs.append(rd.counted("calls", "", 2, 14))
    out = rd.holm(diffs)
    # sorted 0.001, 0.004, 0.02 -> x3, x2, x1 = 0.003, 0.008, 0.02 (monotone)
    assert [d.p for d in out[:3]] == [pytest.approx(0.02), pytest.approx(0.003), pytest.approx(0.008)]
    assert [d.significant for d in out] == [False, True, True, True]
    assert out[3] is diffs[3]


def test_a_real_shift_is_significant_and_the_same_wiggle_reordered_is_not():
    a = [50 + x for x in NOISE]
    shifted = rd.timed("step time", "ms", a, [65 + x for x in NOISE])
    assert shifted.significant and shifted.delta == pytest.approx(15)
    same = rd.timed("step time", "ms", a, [50 + x for x in reversed(NOISE)])
    assert not same.significant and same.judgement == "within noise"


def test_a_shift_below_the_floor_is_not_significant_however_steady():
    steady = [100.0 + 0.01 * x for x in NOISE]
    small = rd.timed("step time", "ms", steady, [x + 3.0 for x in steady])  # +3 %: p tiny, but under MIN_REL
    assert small.p < 1e-6 and not small.significant
    big = rd.timed("step time", "ms", steady, [x + 6.0 for x in steady])
    assert big.significant
    part = [5.0 + 0.01 * x for x in NOISE]  # a 5 ms phase of a 100 ms step, +20 %: 1 ms, under 5 % of the step
    assert not rd.timed("optimizer", "ms", part, [x + 1.0 for x in part], min_shift=0.05 * 100).significant
    assert rd.timed("optimizer", "ms", part, [x + 6.0 for x in part], min_shift=0.05 * 100).significant


def test_one_stalled_step_does_not_make_a_difference():
    a = [50 + x for x in NOISE]
    b = list(a)
    b[7] = 5000.0  # one step stalled for 5 s: a block median is not moved by it
    d = rd.timed("step time", "ms", a, b)
    assert not d.significant
    assert d.b == pytest.approx(50, abs=1), "the median step: a mean would read 297 ms"


def test_too_few_steps_are_said_not_tested():
    d = rd.timed("step time", "ms", [50, 51, 52], [80, 81, 82])
    assert d.p is None and not d.significant and d.judgement == "too few steps"


def test_counted_readings_differ_or_not_with_a_tolerance_where_given():
    assert rd.counted("bytes", "B", 4096, 4096).judgement == "same"
    assert rd.counted("bytes", "B", 4096, 4097).judgement == "differs"
    assert rd.counted("rss", "B", 1000, 1030, rel_tolerance=0.05).judgement == "same"
    assert rd.counted("rss", "B", 1000, 1100, rel_tolerance=0.05).judgement == "differs"


def test_warm_up_is_the_leading_slow_steps_only():
    settled = [50 + x for x in NOISE]
    assert rd.settled_from([600.0, 450.0, 300.0, *settled]) == 3
    assert rd.settled_from(settled) == 0
    assert rd.settled_from([*settled[:5], 900.0, *settled[5:]]) == 0, "a stall later on is no warm-up"
    assert rd.settled_from([900.0] * 10 + [50.0] * 4) <= 7, "never more than half the run"
