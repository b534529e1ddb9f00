"""The Comm tab's figures (ringtop.tui.tabs.comm.figures) and the view model's verdicts, from constructed
messages whose expected numbers are worked out by hand here. Pure: no Textual."""

from __future__ import annotations

import math

import pytest

from ringtop.protocol import CommStat, Event, Hello, Prediction, Step
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.comm.figures import busbw_series, comm_window, peak_ref, slowest_rank

# Every rank, every step (the "HSDP-like" run: all-reduce inside pairs, all-gather over all 4):
#   all_reduce  2 calls, 8,000,000 B, 4.0 ms busy, group 2 -> algbw 8e6 B / 4 ms = 2.0 GB/s,
#               busbw factor 2(2-1)/2 = 1.0 -> 2.0 GB/s
#   all_gather  4 calls, 6,000,000 B, 2.0 ms busy, group 4 -> algbw 6e6 / 2 ms = 3.0 GB/s,
#               busbw factor (4-1)/4 = 0.75 -> 2.25 GB/s
#   union busy 5 ms (the kinds' 4 + 2 ms overlap by 1 ms), exposed 3 ms, data 5 ms, step 100 ms
#   -> overlap 1 - 3/5 = 40 %, exposed 3 % of the step, idle (5 + 3) / 100 = 8 %,
#      busbw of the step (8e6 x 1.0 + 6e6 x 0.75) B / 5 ms = 12.5e6 / 5e-3 = 2.5 GB/s
AR = dict(kind="all_reduce", count=2, bytes=8_000_000, busy_ms=4.0, group_size=2)
AG = dict(kind="all_gather", count=4, bytes=6_000_000, busy_ms=2.0, group_size=4)
PRED = Prediction(comm_payload_bytes={"all_reduce": 8_000_000, "all_gather": 5_000_000, "reduce_scatter": 2_000_000})


def hello(rank: int, prediction: Prediction | None = PRED, world_size: int = 4) -> Hello:
    return Hello(rank=rank, seq=0, ts=1000.0, run_id="hsdp", world_size=world_size, host="h", pid=10 + rank,
                 strategy="fsdp", strategy_options={"sharding": "hybrid"}, prediction=prediction)


def step(rank: int, n: int, step_ms: float = 100.0, comm=None, **kw) -> Step:
    kw.setdefault("data_ms", 5.0)
    kw.setdefault("exposed_comm_ms", 3.0)
    kw.setdefault("comm_busy_ms", 5.0)
    return Step(rank=rank, seq=n, ts=1000.0 + n, step=n, loss=2.0, step_ms=step_ms,
                comm=[CommStat(**AR), CommStat(**AG)] if comm is None else comm, **kw)


def run(ranks: int = 4, steps: int = 3, prediction: Prediction | None = PRED) -> RunView:
    v = RunView()
    for r in range(ranks):
        v.apply(hello(r, prediction), now=1.0)
    for n in range(1, steps + 1):
        for r in range(ranks):
            v.apply(step(r, n), now=1.0)
    return v


def test_per_kind_bandwidth_exposed_and_overlap_over_all_ranks():
    v = run()
    w = comm_window(v)
    assert (w.rank, w.ranks, w.rank_steps, w.first_step, w.last_step) == (None, 4, 12, 1, 3)
    kinds = {k.kind: k for k in w.kinds}
    assert list(kinds) == ["all_reduce", "all_gather", "reduce_scatter"]  # predicted-only kinds last
    ar, ag, rs = kinds["all_reduce"], kinds["all_gather"], kinds["reduce_scatter"]
    assert (ar.count_per_step, ar.bytes_per_step, ar.busy_ms_per_step) == (2, 8_000_000, 4.0)
    assert ar.algbw_gbps == pytest.approx(2.0) and ar.busbw_gbps == pytest.approx(2.0)  # factor 1.0 at n = 2
    assert ar.group_sizes == (2,)
    assert ag.algbw_gbps == pytest.approx(3.0) and ag.busbw_gbps == pytest.approx(2.25)  # factor 0.75 at n = 4
    assert (ar.predicted_bytes, ag.predicted_bytes) == (8_000_000, 5_000_000)
    assert not rs.measured and rs.bytes_per_step == 0 and rs.predicted_bytes == 2_000_000
    assert math.isnan(rs.busbw_gbps)
    assert (w.step_ms, w.data_ms, w.exposed_comm_ms, w.busy_ms) == (100.0, 5.0, 3.0, 5.0)
    assert w.overlap_pct == pytest.approx(40.0)
    assert w.exposed_pct == pytest.approx(3.0) and w.idle_pct == pytest.approx(8.0)
    assert w.bytes_per_step == 14_000_000 and w.predicted_bytes == 15_000_000
    assert w.busbw_gbps == pytest.approx(2.5)
    assert v.ranks[0].idle_pct == pytest.approx(8.0) and v.ranks[0].comm_busy_ms == 5.0


def test_one_rank_and_a_window_of_the_last_steps():
    v = run(ranks=2, steps=3)
    # rank 1 takes longer for its all-reduce in step 4: 8e6 B in 16 ms = 0.5 GB/s
    slow_ar = dict(AR, busy_ms=16.0)
    v.apply(step(0, 4), now=1.0)
    v.apply(step(1, 4, comm=[CommStat(**slow_ar), CommStat(**AG)], comm_busy_ms=17.0, exposed_comm_ms=15.0), now=1.0)
    w1 = comm_window(v, rank=1, window=2)  # steps 3 and 4 of rank 1
    assert (w1.rank, w1.ranks, w1.rank_steps, w1.first_step, w1.last_step) == (1, 1, 2, 3, 4)
    ar = w1.kinds[0]
    # (4 + 16) ms for 2 x 8e6 B: 16e6 / 20e-3 = 0.8 GB/s
    assert ar.busy_ms_per_step == pytest.approx(10.0) and ar.algbw_gbps == pytest.approx(0.8)
    # exposed (3 + 15) / 2 = 9 ms of busy (5 + 17) / 2 = 11 ms: overlap 1 - 9/11
    assert w1.overlap_pct == pytest.approx(100 * (1 - 9 / 11))
    w0 = comm_window(v, rank=0, window=2)
    assert w0.kinds[0].algbw_gbps == pytest.approx(2.0)
    # all ranks, the last 2 step numbers: 4 rank-steps, all-reduce busy (4+4+4+16)/4 = 7 ms
    wa = comm_window(v, window=2)
    assert (wa.rank_steps, wa.ranks) == (4, 2) and wa.kinds[0].busy_ms_per_step == pytest.approx(7.0)
    # the chart: rank 1's step 4 moves 12.5e6 bus bytes in 17 ms
    series = busbw_series(v, rank=1)
    assert series[:3] == pytest.approx([2.5, 2.5, 2.5]) and series[3] == pytest.approx(12.5e6 / 17e-3 / 1e9)
    # over all ranks per step number: (12.5e6 + 12.5e6) / (5 + 17) ms
    assert busbw_series(v)[-1] == pytest.approx(25e6 / 22e-3 / 1e9)


def test_overlap_is_clamped_and_absent_things_are_nan_or_none():
    v = RunView()
    v.apply(hello(0, prediction=None, world_size=1), now=1.0)
    # exposed above busy (clocks disagree): overlap clamps to 0; no prediction: None
    v.apply(step(0, 1, exposed_comm_ms=9.0, comm_busy_ms=5.0), now=1.0)
    w = comm_window(v)
    assert w.overlap_pct == 0.0 and w.predicted_bytes is None
    assert all(k.predicted_bytes is None for k in w.kinds)
    # no union busy time sent (an older agent): no overlap; busbw falls back to the kinds' time (6 ms)
    v2 = RunView()
    v2.apply(step(0, 1, comm_busy_ms=0.0), now=1.0)
    w2 = comm_window(v2)
    assert math.isnan(w2.overlap_pct) and w2.busbw_gbps == pytest.approx(12.5e6 / 6e-3 / 1e9)
    # point-to-point has no busbw factor in the cost model: algbw only
    v3 = RunView()
    v3.apply(step(0, 1, comm=[CommStat(kind="send", count=1, bytes=1_000_000, busy_ms=1.0, group_size=2)]), now=1.0)
    k = comm_window(v3).kinds[0]
    assert k.algbw_gbps == pytest.approx(1.0) and math.isnan(k.busbw_gbps)
    # nothing at all
    empty = comm_window(RunView())
    assert empty.empty and math.isnan(empty.overlap_pct) and math.isnan(empty.busbw_gbps)


def test_slowest_rank_by_compute_when_ranks_run_in_lockstep():
    v = RunView()
    for r in (0, 1):
        v.apply(hello(r, world_size=2), now=1.0)
    # equal step times; rank 0 waits 150 ms at the all-reduce for rank 1, which waits 10 ms:
    # compute 200 - 150 - 0 = 50 ms against 200 - 10 - 0 = 190 ms: rank 1, +280 %
    for n in (1, 2):
        v.apply(step(0, n, step_ms=200.0, data_ms=0.0, exposed_comm_ms=150.0, comm_busy_ms=160.0), now=1.0)
        v.apply(step(1, n, step_ms=200.0, data_ms=0.0, exposed_comm_ms=10.0, comm_busy_ms=20.0), now=1.0)
    s = slowest_rank(v)
    assert s is not None and (s.rank, s.compute_ms, s.others_median_ms) == (1, 190.0, 50.0)
    assert s.excess_pct == pytest.approx(280.0)
    # within a few percent: nobody is named
    v2 = run(ranks=2, steps=2)
    assert slowest_rank(v2) is None


def test_peak_reference_hook_and_from_the_agents_evidence():
    v = run(ranks=2, steps=2)
    series = busbw_series(v)
    ref = peak_ref(v, series)
    assert not ref.known and ref.gbps == pytest.approx(2.5)  # the highest busbw seen
    # a comm_bound verdict carries the agent's --link peak
    v.apply(Event(rank=0, seq=9, ts=1005.0, level="warn", kind="verdict", text="communication-bound: 40 %",
                  step=20, data={"rule": "comm_bound", "rank": None,
                                 "evidence": {"exposed_comm_share": 0.4, "link_peak_gbps": 25.0}, "advice": "x"}),
            now=1.0)
    ref = peak_ref(v, series)
    assert ref.known and ref.gbps == 25.0 and ref.pct(2.5) == pytest.approx(10.0)
    # a peak configured in the UI wins, and survives a new run
    v.set_link_peak(450.0, "nvlink4")
    v.apply(Hello(rank=0, seq=0, ts=2000.0, run_id="other", world_size=2, pid=99), now=2.0)
    assert (v.link_peak_gbps, v.link_peak_source) == (450.0, "nvlink4")


def verdict(rank_of: int | None, rule: str = "straggler", seq: int = 50, step: int = 20, text: str = "") -> Event:
    body = {"rule": rule, "rank": rank_of, "evidence": {"compute_ms": 210.0, "others_compute_ms": 58.0},
            "advice": "check that rank's host"}
    return Event(rank=0, seq=seq, ts=1000.0 + seq, level="warn", kind="verdict",
                 text=text or f"rank {rank_of} is a straggler: compute 210 ms per step", step=step, data=body)


def cleared(rank_of: int | None, rule: str = "straggler", seq: int = 60) -> Event:
    return Event(rank=0, seq=seq, ts=1000.0 + seq, level="info", kind="verdict_cleared",
                 text=f"cleared: rank {rank_of} is a straggler", step=40, data={"rule": rule, "rank": rank_of})


def test_verdicts_appear_clear_and_end_in_a_diagnosis():
    v = run(ranks=2, steps=1)
    v.apply(verdict(1), now=1.0)
    v.apply(verdict(None, rule="comm_bound", seq=51, text="communication-bound: 40 % of each step"), now=1.0)
    active = v.active_verdicts
    assert [(x.rule, x.rank) for x in active] == [("comm_bound", None), ("straggler", 1)]  # newest first
    s = v.verdicts[("straggler", 1)]
    assert s.evidence == {"compute_ms": 210.0, "others_compute_ms": 58.0} and s.advice == "check that rank's host"
    assert s.step == 20
    # verdict events are still listed as events, but are not the Overview's "last warning"
    assert [e.kind for e in v.events][-2:] == ["verdict", "verdict"] and v.last_warning is None
    v.apply(cleared(1), now=1.0)
    assert [(x.rule, x.rank) for x in v.active_verdicts] == [("comm_bound", None)]
    assert [(x.rule, x.rank, x.cleared_step) for x in v.cleared_verdicts] == [("straggler", 1, 40)]
    v.apply(cleared(None, rule="comm_bound", seq=61), now=1.0)
    assert v.active_verdicts == []
    v.apply(Event(rank=0, seq=70, ts=1070.0, level="warn", kind="diagnosis", text="diagnosis: rank 1 is a straggler",
                  step=60, data={"verdicts": [{"rule": "straggler", "rank": 1, "text": "rank 1 is a straggler",
                                               "advice": "check that rank's host"}]}), now=1.0)
    d = v.diagnosis
    assert d is not None and d.step == 60 and [(x.rule, x.rank, x.text) for x in d.verdicts] == \
        [("straggler", 1, "rank 1 is a straggler")]


def test_malformed_verdict_data_does_not_break_the_view():
    v = RunView()
    v.apply(Event(rank=0, seq=1, ts=1.0, level="warn", kind="verdict", text="odd", data={"rule": 3, "rank": "x",
                                                                                         "evidence": [1], "advice": 7}),
            now=1.0)
    (x,) = v.active_verdicts
    assert (x.rule, x.rank, x.evidence, x.advice, x.text) == ("verdict", None, {}, "", "odd")
    v.apply(Event(rank=0, seq=2, ts=2.0, kind="diagnosis", data={"verdicts": "nope"}), now=1.0)
    assert v.diagnosis is not None and v.diagnosis.verdicts == []


def test_a_new_strategy_restarts_the_comm_window():
    v = run(ranks=2, steps=3)
    assert comm_window(v).rank_steps == 6
    v.apply(Hello(rank=0, seq=10, ts=1010.0, run_id="hsdp", world_size=2, pid=10, strategy="ddp"), now=1.0)
    assert comm_window(v).empty and busbw_series(v) == [] and not v.ranks[1].comm_history


def test_comm_modules_have_no_ui_imports_beyond_rich():
    import ringtop.tui.tabs.comm.figures as c

    src = open(c.__file__).read()
    assert "textual" not in src and "import torch" not in src and "rich" not in src


def test_bandwidth_and_size_formats():
    from ringtop.metrics.fmt import gbps, mib, per_step

    assert [gbps(x) for x in (float("nan"), 0.0, 0.0004, 0.00137, 0.0137, 0.5, 2.25, 13.7, 450.0)] == \
        ["-", "0", "4.0e-04", "0.00137", "0.0137", "0.500", "2.25", "13.7", "450"]
    # binary: 4,221,952 B / 2**20 = 4.026 MiB, 12,665,856 B = 12.08, 422,195,200 B = 402.6, 4,221,952,000 B = 4,026
    assert [mib(x) for x in (None, 0, 4_221_952, 12_665_856, 422_195_200, 4_221_952_000)] == \
        ["-", "0", "4.03", "12.1", "403", "4,026"]
    assert [per_step(x) for x in (2.0, 1.95, 10.0)] == ["2", "1.95", "10"]
