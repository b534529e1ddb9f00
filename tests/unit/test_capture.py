"""Capture on trigger (agent/control/capture.py): which events profile whom, at most once per window."""

from __future__ import annotations

import pytest

from ringtop.agent.control.capture import CaptureSettings, CaptureTrigger
from ringtop.protocol import Event, HangReport, decode, encode


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def trigger(on=("straggler", "spike", "stall"), every_min=10.0, world=4, accept=True):
    injected, said, clock = [], [], Clock()
    t = CaptureTrigger(CaptureSettings(on=on, every_min=every_min, steps=2), world,
                       lambda cmd, args: injected.append((cmd, args)) or accept, lambda *a: said.append(a), clock)
    return t, injected, said, clock


def straggler(rank: int) -> Event:
    return decode(encode(Event(rank=0, level="warn", kind="verdict", text=f"rank {rank} is a straggler",
                               data={"rule": "straggler", "rank": rank, "ranks": [rank]})))


def test_a_straggler_profiles_itself_and_one_healthy_rank_once_per_window():
    t, injected, said, clock = trigger()
    t.observe(straggler(0))
    assert injected == [("profile", {"steps": 2, "ranks": [0, 1], "reason": "capture on straggler: rank 0 is a "
                                                                            "straggler"})]
    assert said[0][:2] == ("info", "capture")
    clock.t += 9 * 60
    t.observe(straggler(2))
    assert len(injected) == 1 and t.held_back == 1, "inside the window: held back"
    clock.t += 61
    t.observe(straggler(2))
    assert injected[-1][1]["ranks"] == [2, 0]


def test_spikes_and_stalls_name_their_ranks_and_other_events_nothing():
    t, injected, _, _ = trigger(every_min=0)
    t.observe(Event(rank=3, level="warn", kind="loss_spike", text="loss 50x its median"))
    t.observe(decode(encode(Event(rank=0, level="warn", kind="hang", text="rank 1 stalls",
                                  hang=HangReport(verdict="stall", culprits=[1, 2])))))
    t.observe(decode(encode(Event(rank=0, level="error", kind="hang", text="rank 1 hangs",
                                  hang=HangReport(verdict="hang", culprits=[1])))))
    t.observe(Event(rank=0, level="warn", kind="verdict", text="comm bound", data={"rule": "comm_bound"}))
    assert [args["ranks"] for _, args in injected] == [[3, 0], [1, 2, 0]]


def test_only_the_triggers_asked_for_and_a_full_queue_does_not_count():
    t, injected, _, _ = trigger(on=("spike",))
    t.observe(straggler(1))
    assert injected == []
    t, injected, _, _ = trigger(accept=False)
    t.observe(straggler(1))
    assert len(injected) == 1 and t.captures == 0 and t.last is None, "dropped: the next trigger may try again"


@pytest.mark.parametrize("kwargs", [{"on": ("sneeze",)}, {"every_min": -1}, {"steps": 0}, {"steps": 101}])
def test_settings_are_validated(kwargs):
    with pytest.raises(ValueError):
        CaptureSettings(**kwargs)
