"""Incidents (metrics/rules/incidents.py): one notice when an incident opens, one when it
resolves, none for its restatements, a rate limit over all of them."""

from __future__ import annotations

from ringtop.metrics.rules.incidents import SPIKE_QUIET_STEPS, FloorWatch, Incidents, Signal, SpikeWatch

HANG = Signal("hang", True, "rank 1 is stuck in forward", (1,), 40)


def test_an_incident_is_announced_once_and_resolved_once():
    inc = Incidents()
    first = inc.feed(HANG, 100.0)
    assert [(n.action, n.kind, n.ranks) for n in first] == [("opened", "hang", (1,))]
    for t in range(101, 130):  # the hang watch restates it every few seconds; another culprit is the same hang
        assert inc.feed(Signal("hang", True, "ranks 1, 2 are stuck", (1, 2), 40), float(t)) == []
    (done,) = inc.feed(Signal("hang", False, "every rank steps again", step=44), 130.0)
    assert (done.action, done.ranks, done.ts - done.opened_ts) == ("resolved", (1, 2), 30.0)
    assert inc.feed(Signal("hang", False, "again"), 131.0) == [], "nothing to resolve twice"


def test_kinds_are_incidents_of_their_own_and_the_run_end_resolves_what_is_left():
    inc = Incidents()
    inc.feed(HANG, 1.0)
    inc.feed(Signal("death", True, "rank 0 died", (0,), 41), 2.0)
    ended = inc.run_ended("the run ended: failed", -1, 9.0)
    assert sorted((n.kind, n.action) for n in ended) == [("death", "resolved"), ("hang", "resolved")]
    assert inc.open == {}


def test_the_rate_limit_counts_what_it_holds_back():
    inc = Incidents(max_per_window=3, window_s=60)
    notices = []
    for i in range(5):
        notices += inc.feed(Signal("stall", i % 2 == 0, f"stall {i}"), float(i))
    assert len(notices) == 3 and inc.suppressed == 2
    assert inc.feed(Signal("nonfinite", True, "nan"), 100.0), "the window moved on"


def test_a_spike_ends_after_quiet_steps_and_a_floor_does_not_flap():
    spikes = SpikeWatch()
    spikes.spiked(10)
    assert not spikes.over(10 + SPIKE_QUIET_STEPS - 1) and spikes.over(10 + SPIKE_QUIET_STEPS)
    assert not spikes.over(10 + SPIKE_QUIET_STEPS + 1), "over once"
    floor = FloorWatch(0.8, margin=0.02)
    assert [floor.crossed(v) for v in (0.9, 0.79, 0.5, 0.81, 0.815, 0.83, 0.79)] == \
        [None, True, None, None, None, False, True]
