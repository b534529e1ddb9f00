"""The pipeline schedule arithmetic: replay == theory for equal stages and free transfers; what
imbalance, transfers and per-op overhead add, worked out by hand; the bubble measured from events."""

from __future__ import annotations

import pytest

from ringtop.metrics.costs import pipeline_bubble as pb
from ringtop.metrics.costs import pipeline_schedule as ps
from ringtop.metrics.costs.cost_model import gpipe_bubble_fraction

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("f_ms, b_ms", [(1.0, 1.0), (1.0, 2.0), (0.7, 2.3)])
def test_replay_with_equal_stages_and_free_transfers_is_the_theory(schedule, stages, micro_batches, f_ms, b_ms):
    replay = ps.replay_schedule(schedule, stages, micro_batches, f_ms, b_ms)
    theory = ps.theoretical_bubble(schedule, stages, micro_batches)
    assert theory == gpipe_bubble_fraction(stages, micro_batches)
    assert replay.makespan_ms == pytest.approx((stages + micro_batches - 1) * (f_ms + b_ms), rel=1e-12)
    assert replay.makespan_ms == pytest.approx(ps.theoretical_makespan_ms(stages, micro_batches, f_ms, b_ms))
    for bubble in replay.bubble:
        assert bubble == pytest.approx(theory, abs=1e-12)
    assert replay.pipeline_bubble == pytest.approx(theory, abs=1e-12)
    assert [len(ops) for ops in replay.timeline] == [2 * micro_batches] * stages


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("micro_batches", [1, 4, 8, 32])
def test_1f1b_takes_as_long_as_gpipe_for_equal_stages(stages, micro_batches):
    gpipe = ps.replay_schedule("gpipe", stages, micro_batches, 1.0, 2.0)
    one_f_one_b = ps.replay_schedule("1f1b", stages, micro_batches, 1.0, 2.0)
    assert one_f_one_b.makespan_ms == pytest.approx(gpipe.makespan_ms)
    assert one_f_one_b.bubble == pytest.approx(gpipe.bubble)


def test_the_chapters_numbers():
    assert ps.theoretical_bubble("gpipe", 4, 1) == pytest.approx(0.75)
    assert ps.theoretical_bubble("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert ps.theoretical_bubble("1f1b", 4, 32) == pytest.approx(3 / 35)
    assert ps.replay_schedule("gpipe", 4, 8, 1.0, 1.0).pipeline_bubble == pytest.approx(3 / 11)


def test_stage_order_follows_torch():
    assert ps.stage_order("gpipe", 2, 3, 1) == [(0, "F"), (1, "F"), (2, "F"), (0, "B"), (1, "B"), (2, "B")]
    # 1F1B: stage s warms up with min(M, N - s) forwards, then B/F alternate, then the remaining Bs.
    assert ps.stage_order("1f1b", 4, 6, 0) == [(0, "F"), (1, "F"), (2, "F"), (3, "F"), (0, "B"), (4, "F"),
                                               (1, "B"), (5, "F"), (2, "B"), (3, "B"), (4, "B"), (5, "B")]
    assert ps.stage_order("1f1b", 4, 6, 3) == [(0, "F"), (0, "B"), (1, "F"), (1, "B"), (2, "F"), (2, "B"),
                                               (3, "F"), (3, "B"), (4, "F"), (4, "B"), (5, "F"), (5, "B")]
    assert ps.stage_order("1f1b", 4, 2, 0) == [(0, "F"), (1, "F"), (0, "B"), (1, "B")]  # M < N


def test_imbalance_adds_to_the_bubble_as_worked_out_by_hand():
    # N=2, M=2, stage 1 twice as slow (f = 1, 2 ms; b = 2, 4 ms), free transfers:
    # stage 0: F0 [0,1] F1 [1,2]              B0 [9,11]  B1 [13,15]
    # stage 1:        F0 [1,3] F1 [3,5] B0 [5,9] B1 [9,13]
    r = ps.replay_schedule("gpipe", 2, 2, [1.0, 2.0], [2.0, 4.0])
    assert r.timeline[0] == (ps.ScheduledOp(0, "F", 0, 1), ps.ScheduledOp(1, "F", 1, 2),
                             ps.ScheduledOp(0, "B", 9, 11), ps.ScheduledOp(1, "B", 13, 15))
    assert r.timeline[1] == (ps.ScheduledOp(0, "F", 1, 3), ps.ScheduledOp(1, "F", 3, 5),
                             ps.ScheduledOp(0, "B", 5, 9), ps.ScheduledOp(1, "B", 9, 13))
    assert r.makespan_ms == 15
    assert r.busy_ms == (6, 12)
    assert r.bubble == pytest.approx((1 - 6 / 15, 1 - 12 / 15))  # 0.6, 0.2
    assert r.pipeline_bubble == pytest.approx(1 - 18 / 30)  # 0.4, against 1/3 balanced
    assert ps.replay_schedule("gpipe", 2, 2, 1.5, 3.0).pipeline_bubble == pytest.approx(1 / 3)
    # 1F1B: stage 1 runs F0 B0 F1 B1 - same span here.
    r1 = ps.replay_schedule("1f1b", 2, 2, [1.0, 2.0], [2.0, 4.0])
    assert [op[:2] for op in r1.timeline[1]] == [(0, "F"), (0, "B"), (1, "F"), (1, "B")]
    assert r1.makespan_ms == 15 and r1.pipeline_bubble == pytest.approx(0.4)


def test_transfers_add_to_the_bubble_as_worked_out_by_hand():
    # Same imbalance, 0.5 ms per transfer:
    # stage 1: F0 [1.5,3.5] F1 [3.5,5.5] B0 [5.5,9.5] B1 [9.5,13.5]; stage 0: B0 [10,12] B1 [14,16]
    r = ps.replay_schedule("gpipe", 2, 2, [1.0, 2.0], [2.0, 4.0], p2p_ms=0.5)
    assert r.makespan_ms == 16
    assert r.bubble == pytest.approx((1 - 6 / 16, 1 - 12 / 16))
    assert r.pipeline_bubble == pytest.approx(1 - 18 / 32)  # 0.4375 = 0.4 + 0.0375 from transfers
    # Equal stages, M = 1: the transfers sit on the critical path 2(N-1) times.
    for stages in (2, 4):
        r = ps.replay_schedule("gpipe", stages, 1, 1.0, 1.0, p2p_ms=0.5)
        assert r.makespan_ms == pytest.approx(stages * 2 + 2 * (stages - 1) * 0.5)


def test_per_op_overhead_adds_to_the_bubble():
    # One stage, two micro-batches, 0.25 ms before each op: F0 [.25,1.25] F1 [1.5,2.5] B0 [2.75,3.75] B1 [4,5]
    r = ps.replay_schedule("gpipe", 1, 2, 1.0, 1.0, overhead_ms=0.25)
    assert r.makespan_ms == 5 and r.bubble == (pytest.approx(0.2),)


def test_per_micro_batch_times_and_bad_input():
    r = ps.replay_schedule("gpipe", 1, 2, [[1.0, 3.0]], [[2.0, 2.0]])
    assert r.makespan_ms == 8 and r.bubble == (0.0,)
    with pytest.raises(ValueError, match="schedule"):
        ps.replay_schedule("zigzag", 2, 2, 1, 1)
    with pytest.raises(ValueError, match="entries"):
        ps.replay_schedule("gpipe", 2, 2, [1.0], 1.0)
    with pytest.raises(ValueError, match=">= 1"):
        ps.replay_schedule("gpipe", 2, 0, 1, 1)
    with pytest.raises(ValueError, match="p2p_ms"):
        ps.replay_schedule("gpipe", 2, 2, 1, 1, p2p_ms=-1)
    assert ps.check_schedule("1F1B") == ps.check_schedule("one_f_one_b") == "1f1b"


def test_measured_bubble_from_hand_made_events():
    # stage 0: F0 [0,1] ......... B0 [3,4];  stage 1: F0 [1,2] B0 [2,3]
    events = [(0, 0, "F", 0.0, 1.0), (1, 0, "F", 1.0, 2.0), (1, 0, "B", 2.0, 3.0), (0, 0, "B", 3.0, 4.0)]
    assert ps.measured_bubble(events) == {0: pytest.approx(0.5), 1: pytest.approx(0.5)}  # the span [0, 4]
    assert ps.measured_bubble(events, window_ms=5.0) == {0: pytest.approx(0.6), 1: pytest.approx(0.6)}
    times = ps.stage_times(events, window_ms={0: (0.0, 4.0), 1: (0.0, 4.0)})
    assert times[0].busy_ms == 2 and times[0].forward_ms == 1 and times[0].backward_ms == 1
    assert times[0].wait_recv_ms == 2  # before B0, waiting on stage 1's gradient
    assert times[1].wait_recv_ms == 1  # before F0, waiting on stage 0's activations
    assert times[1].idle_ms == 2 and times[1].ops == 2
    # This is the M=1 theory exactly: (2-1)/(2+1-1).
    assert pb.explain_bubble(events, "gpipe", 2, 1).measured == pytest.approx(ps.theoretical_bubble("gpipe", 2, 1))
    with pytest.raises(ValueError, match="kind"):
        ps.measured_bubble([(0, 0, "X", 0, 1)])


def test_estimates_recover_the_transfer_time_and_the_breakdown_adds_up():
    # Events taken from a replay with known imbalance and transfers: the estimate finds the transfer
    # time, the full replay reproduces the measurement, and the parts add up to it.
    true = ps.replay_schedule("gpipe", 2, 4, [1.0, 1.5], [2.0, 3.0], p2p_ms=0.4)
    events = [(s, op.micro_batch, op.kind, op.start_ms, op.end_ms) for s, ops in enumerate(true.timeline) for op in ops]
    assert ps.estimate_p2p_ms(events) == pytest.approx(0.4)
    assert ps.estimate_overhead_ms(events) == pytest.approx(0.0)
    fwd, bwd = ps.mean_op_ms(events, 2)
    assert fwd == pytest.approx([1.0, 1.5]) and bwd == pytest.approx([2.0, 3.0])
    again = pb.replay_from_events(events, "gpipe", 2, 4)
    assert again.makespan_ms == pytest.approx(true.makespan_ms)
    window = {s: (0.0, true.makespan_ms) for s in range(2)}
    b = pb.explain_bubble(events, "gpipe", 2, 4, window)
    assert b.theory == pytest.approx(1 / 5) and b.replay_balanced == pytest.approx(b.theory)
    assert b.measured == pytest.approx(true.pipeline_bubble)
    assert b.from_imbalance > 0 and b.from_transfers > 0 and b.from_overhead == pytest.approx(0)
    assert (b.from_schedule + b.from_imbalance + b.from_transfers + b.from_overhead + b.unexplained
            == pytest.approx(b.measured))
    assert b.unexplained == pytest.approx(0, abs=1e-12)


def test_splits():
    assert ps.balanced_split(4, 2) == [2, 2]
    assert ps.balanced_split(6, 4) == [2, 2, 1, 1]
    assert [list(r) for r in ps.stage_layers([1, 3])] == [[0], [1, 2, 3]]
    assert ps.check_split([1, 3], 4, 2) == [1, 3]
    for bad, match in (([2, 2, 0], "entries"), ([0, 4], ">= 1"), ([1, 2], "covers 3")):
        with pytest.raises(ValueError, match=match):
            ps.check_split(bad, 4, 2)
    with pytest.raises(ValueError):
        ps.balanced_split(2, 3)

