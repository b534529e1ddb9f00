"""One window sum (issue 30): a large run's per-rank Comm figures and the Comm tab's window of that
rank come from the same sums (`CommStep.add_timed`) and means (`window_means`), checked against
hand-computed values, and rank by rank against each other on steps with holes and non-finite times."""

from __future__ import annotations

import math
import random

import pytest

from ringtop.protocol import CommStat, Hello, Step
from ringtop.tui.state.reducers.comm import CommStep, step_idle
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.comm.figures import rank_window, window_means
from ringtop.tui.tabs.comm.scale import rank_comm

WORLD = 4


def _step(step: int, step_ms: float, data_ms: float, exposed_ms: float, busy_ms: float, comm: list[CommStat],
          rank: int = 0) -> Step:
    return Step(rank=rank, seq=step, ts=100.0 + step, step=step, loss=1.0, step_ms=step_ms, data_ms=data_ms,
                exposed_comm_ms=exposed_ms, comm_busy_ms=busy_ms, comm=comm)


def _hand_window(union_busy_ms: float) -> CommStep:
    steps = [
        _step(1, 100.0, 5.0, 10.0, union_busy_ms / 2, [
            CommStat(kind="all_reduce", count=2, bytes=400_000_000, busy_ms=20.0, group_size=4),
            CommStat(kind="all_gather", count=1, bytes=100_000_000, busy_ms=10.0, group_size=0)]),
        _step(2, 120.0, math.nan, 20.0, union_busy_ms / 2, [
            CommStat(kind="all_reduce", count=1, bytes=200_000_000, busy_ms=math.nan, group_size=4)]),
    ]
    total = CommStep(step=-1)
    for s in steps:
        total.add_timed(s, step_idle(s))
    return total


# all_reduce over 4: 2·3/4 = 1.5 x 600 MB = 900 MB; all_gather over the world (no group size): (w-1)/w x 100 MB
@pytest.mark.parametrize(("world", "bus_bytes"), [(4, 900e6 + 75e6), (8, 900e6 + 87.5e6)])
@pytest.mark.parametrize("union_busy_ms", [0.0, 25.0])
def test_window_means_match_a_hand_computed_window(world, bus_bytes, union_busy_ms):
    m = window_means(_hand_window(union_busy_ms), world)
    assert m.rank_steps == 2
    assert m.step_ms == pytest.approx(110.0)
    assert m.data_ms == pytest.approx(2.5)  # a time that is not finite counts as none
    assert m.exposed_comm_ms == pytest.approx(15.0)
    assert m.idle_ms == pytest.approx((15.0 + 20.0) / 2)  # none reported: input + exposed comm
    assert m.bytes_per_step == pytest.approx(350e6) and m.count_per_step == pytest.approx(2.0)
    assert m.kind_busy_ms == pytest.approx(15.0)  # the NaN busy time adds none
    busy_ms = union_busy_ms or 30.0  # without the union, the kinds' busy times added up
    assert m.busbw_gbps == pytest.approx(bus_bytes / (busy_ms / 1e3) / 1e9)


def test_an_empty_window_has_no_means():
    assert window_means(CommStep(step=-1), WORLD) is None


def _odd(rng: random.Random, x: float) -> float:
    return rng.choice((math.nan, math.inf)) if rng.random() < 0.1 else x


def _view(seed: int) -> RunView:
    rng = random.Random(seed)
    view = RunView(watch_liveness=False)
    view.apply_many([Hello(rank=r, seq=0, ts=100.0, run_id="sums", world_size=WORLD, host=f"h{r // 2}", pid=9 + r,
                           strategy="ddp") for r in range(WORLD)], now=1.0)
    msgs = []
    for n in range(1, 40):
        for r in range(WORLD):
            if rng.random() < 0.15:
                continue  # a rank misses a step
            comm = [CommStat(kind=k, count=rng.randint(1, 3), bytes=rng.randint(0, 10**7),
                             busy_ms=_odd(rng, rng.uniform(0.1, 9.0)), group_size=g, group=dim)
                    for k, g, dim in (("all_reduce", 2, "dp"), ("all_gather", 2, "tp"), ("broadcast", 0, ""))
                    if rng.random() > 0.2]
            msgs.append(_step(n, rng.uniform(50.0, 150.0), _odd(rng, rng.uniform(0.0, 5.0)),
                              _odd(rng, rng.uniform(0.0, 9.0)), _odd(rng, rng.uniform(0.0, 20.0)) if n % 3 else 0.0,
                              comm, rank=r))
    view.apply_many(msgs, now=2.0)
    return view


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_large_runs_rank_figures_are_the_comm_tabs_window_of_that_rank(seed):
    view = _view(seed)
    figures = rank_comm(view)
    assert set(figures) == set(range(WORLD))
    for rank, f in figures.items():
        w = rank_window(view, rank)
        assert w.rank_steps > 0
        pairs = {"step_ms": (f.step_ms, w.step_ms), "compute_ms": (f.compute_ms, w.compute_ms),
                 "exposed_comm_ms": (f.exposed_comm_ms, w.exposed_comm_ms), "idle_pct": (f.idle_pct, w.idle_pct),
                 "busbw_gbps": (f.busbw_gbps, w.busbw_gbps), "bytes_per_step": (f.bytes_per_step, w.bytes_per_step)}
        assert all(_same(a, b) for a, b in pairs.values()), (rank, pairs)


def test_the_agreement_check_bites_on_a_shorter_window():
    """A per-rank figure read over another window than the Comm tab's differs: the check above
    would say so."""
    view = _view(1)
    f = rank_comm(view, window=5)[0]
    w = rank_window(view, 0)
    assert not _same(f.step_ms, w.step_ms)
