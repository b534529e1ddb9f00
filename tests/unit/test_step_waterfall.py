"""Where the step went (metrics/step_waterfall.py): the parts add up to the step for any numbers a
log may hold, and hand-worked steps land in the right parts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringtop.metrics import step_waterfall as wf

ms = st.one_of(st.floats(min_value=0, max_value=1e5), st.just(math.nan), st.just(math.inf), st.just(-3.0))


@given(step=st.floats(min_value=0.001, max_value=1e5), data=ms, fwd=ms, bwd=ms, opt=ms, exposed=ms, idle=ms,
       pipeline=st.booleans(), mfu=st.one_of(st.none(), st.floats(min_value=0, max_value=2)))
def test_the_parts_are_never_negative_and_add_up_to_the_step(step, data, fwd, bwd, opt, exposed, idle, pipeline, mfu):
    parts = wf.step_parts(step, data, fwd, bwd, opt, exposed, idle, pipeline, mfu)
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(step, rel=1e-9, abs=1e-9)
    assert list(parts) == [p for p in wf.PARTS if p in parts]


def test_a_ddp_step_by_hand():
    # 36 ms: data 1, forward 10, backward 20 of which 5 waited on the all-reduce, optimizer 4, 1 ms after
    parts = wf.step_parts(36, 1, 10, 20, 4, exposed_comm_ms=5, idle_ms=6)
    assert parts == {wf.COMPUTE: 25, wf.EXPOSED_COMM: 5, wf.BUBBLE: 0, wf.DATA: 1, wf.OPTIMIZER: 4, wf.REST: 1}


def test_a_pipeline_stage_by_hand():
    # idle 13 = data 1 + a 12 ms bubble, inside forward + backward (40); 2 ms exposed on the dp all-reduce
    parts = wf.step_parts(50, 1, 25, 15, 8, exposed_comm_ms=2, idle_ms=13, pipeline=True)
    assert parts[wf.BUBBLE] == 12 and parts[wf.EXPOSED_COMM] == 2 and parts[wf.COMPUTE] == 26
    assert wf.step_parts(50, 1, 25, 15, 8, 2, 13, pipeline=False)[wf.BUBBLE] == 0, "only a pipeline has a bubble"


def test_the_ideal_is_the_mfu_share_and_the_rest_of_compute_is_below_peak():
    parts = wf.step_parts(40, 0, 20, 10, 6, exposed_comm_ms=4, mfu_ratio=0.25)
    assert parts[wf.IDEAL] == 10 and parts[wf.COMPUTE_BELOW_PEAK] == 16
    gap = sum(share for name, share in wf.shares(parts).items() if name != wf.IDEAL)
    assert gap == pytest.approx(1 - 0.25), "the parts besides the ideal are MFU's gap to 100 %"


def test_a_wait_longer_than_forward_and_backward_is_taken_from_the_optimizer():
    # ZeRO-3-like: 12 ms exposed, forward + backward only 8
    parts = wf.step_parts(30, 0, 3, 5, 20, exposed_comm_ms=12)
    assert parts[wf.COMPUTE] == 0 and parts[wf.EXPOSED_COMM] == 12 and parts[wf.OPTIMIZER] == 16


def test_mean_parts_and_the_line():
    mean = wf.mean_parts([{wf.COMPUTE: 30, wf.DATA: 10}, {wf.COMPUTE: 10, wf.DATA: 30}])
    assert mean == {wf.COMPUTE: 20, wf.DATA: 20}
    assert wf.line(mean) == "compute 50% · data wait 50%"
