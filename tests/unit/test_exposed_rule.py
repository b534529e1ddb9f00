"""The exposed-communication rule is one function (comm_tracer.exposed_ns), used by the host drain and
the device drain alike: measured stalls first, else the tail after the last collective's start,
never more than the time anything was in flight."""

from __future__ import annotations

import pytest

from ringtop.agent.instruments.comm_tracer import CommTracer, exposed_ns


@pytest.mark.parametrize(("stalls", "collectives", "busy_ns", "expected"), [
    # two overlapping stalls 10..30 and 20..50 cover 40; the collectives' tail (90 - 70 = 20) is not used
    ([(10, 30), (20, 50)], [(0, 60), (70, 90)], 90, 40),
    # no stall: last start 70, last end 100 -> 30
    ([], [(0, 100), (70, 90)], 100, 30),
    # a tail longer than what was in flight is capped at it
    ([], [(0, 100), (70, 90)], 25, 25),
    # stalls with nothing in flight (busy None): not capped
    ([(0, 40)], [], None, 40),
    # the tail counts from the latest start (50), whichever collective ends last
    ([], [(50, 60), (0, 10)], 20, 10),
    ([], [], None, 0),
])
def test_the_exposed_rule_against_hand_computed_values(stalls, collectives, busy_ns, expected):
    assert exposed_ns(stalls, collectives, busy_ns) == expected


def test_the_exposed_rule_bites_a_stall_wins_over_the_tail_and_the_cap_holds():
    """Variants a wrong rule would give: the tail instead of the stall (20), the stall uncapped (40)."""
    assert exposed_ns([(10, 50)], [(0, 60), (70, 90)], 90) == 40 != 20
    assert exposed_ns([(10, 50)], [(0, 30)], 30) == 30 != 40


def test_the_host_drain_caps_a_measured_wait_at_the_collectives_time_in_flight():
    tracer = CommTracer()
    tracer.end(tracer.begin("all_reduce", 64, 2))
    entry = tracer.ledger[-1]
    in_flight_ns = entry.done_ns - entry.issued_ns
    tracer.blocked(entry.issued_ns - 10**9, entry.done_ns + 10**9)  # a wait far longer than the collective
    summary = tracer.drain()
    assert summary.busy_ms == pytest.approx(in_flight_ns / 1e6)
    assert summary.exposed_comm_ms == pytest.approx(in_flight_ns / 1e6)

    tracer.blocked(0, 2_000_000)  # 2 ms waited, nothing in flight since the last drain: not capped
    assert tracer.drain().exposed_comm_ms == pytest.approx(2.0)
