"""A UI that attaches mid-run gets the run's goodput, not the share of the wall it happened to see:
rank 0's real relay (CURVE, real sockets) hands each new subscriber its count (GoodputSoFar), and
the subscriber's Goodput goes on from there. The expected numbers are the fold of every message
the test sent (`goodput_of`), which the relay and the subscribers never see as a whole."""

from __future__ import annotations

import pytest
from background_socket import drain, framed, relay_with_ranks, subscribed, subscriber

from ringtop.metrics.goodput import CAUSES, Goodput, goodput_of
from ringtop.protocol import Bye, Event, GoodputSoFar, Hello, Stall, Step

pytestmark = pytest.mark.timeout(60)

T0 = 1_780_000_000.0


def the_run() -> tuple[list, list]:
    """(before the late attach, after it): 2 s of start-up from the process start, 300 steps of
    100 ms with a 1.5 s checkpoint and a 2 s stall of rank 1 in the first half, 300 more steps."""
    hellos = [Hello(rank=r, ts=T0 + 2.0, run_id="run", world_size=2, process_started_ts=T0) for r in (0, 1)]
    t, first = 2.0, []
    for n in range(1, 151):
        t += 0.1
        first.append(Step(rank=0, ts=T0 + t, step=n, loss=1.0, step_ms=100.0))
    first.append(Event(rank=0, ts=T0 + t + 1.5, kind="checkpoint", data={"seconds": 1.5}))
    t += 1.5
    first += [Stall(rank=1, ts=T0 + t + 1.0, state="stalled", running_s=1.0),
              Stall(rank=1, ts=T0 + t + 2.0, state="recovered")]
    t += 2.0
    for n in range(151, 301):
        t += 0.1
        first.append(Step(rank=0, ts=T0 + t, step=n, loss=1.0, step_ms=100.0))
    later = []
    for n in range(301, 601):
        t += 0.1
        later.append(Step(rank=0, ts=T0 + t, step=n, loss=1.0, step_ms=100.0))
    later += [Bye(rank=1, ts=T0 + t + 0.01), Bye(rank=0, ts=T0 + t + 0.02)]
    return hellos + first, later


def test_a_ui_attaching_mid_run_gets_the_runs_goodput_from_the_relay(gatekeeper):
    gate, keys = gatekeeper
    before, after = the_run()
    with relay_with_ranks(gate, keys, "run") as (_, publish_addr, pubs):
        early = subscriber(publish_addr, keys.client)
        late = None
        try:
            seen_early: list = []
            for rank in (0, 1):
                subscribed(early, pubs[rank], before[rank], seen_early)
            for msg in before[2:]:
                pubs[msg.rank].send_multipart(framed(msg))
            drain(early, seen_early, lambda got: any(isinstance(m, Stall) and m.state == "recovered" for m in got)
                  and any(isinstance(m, Step) and m.step == 300 for m in got))

            late = subscriber(publish_addr, keys.client)
            seen_late: list = []
            drain(late, seen_late, lambda got: any(isinstance(m, GoodputSoFar) for m in got))
            for msg in after:
                pubs[msg.rank].send_multipart(framed(msg))
            ended = lambda got: any(isinstance(m, Bye) and m.rank == 0 for m in got)  # noqa: E731
            drain(late, seen_late, ended)
            drain(early, seen_early, ended)
        finally:
            for sock in (early, *([late] if late is not None else [])):
                sock.close(0)

    truth = goodput_of([*before, *after])
    assert truth.lost_s["checkpoint"] > 1.0 and truth.lost_s["stall"] > 1.0 and truth.lost_s["startup"] > 1.0
    for seen in (seen_early, seen_late):
        g = Goodput()
        for m in seen:
            g.add(m)
        r = g.result()
        assert r.wall_s == pytest.approx(truth.wall_s, abs=1e-6)
        assert r.productive_s == pytest.approx(truth.productive_s, abs=1e-6)
        assert r.steps == truth.steps == 600
        for cause in CAUSES:
            assert r.lost_s[cause] == pytest.approx(truth.lost_s[cause], abs=1e-6), cause

    # The late subscriber saw the replayed Hellos and the second half only: without the relay's
    # count its goodput is the second half's productive time over the whole wall (the defect).
    assert not any(isinstance(m, Step) and m.step <= 300 for m in seen_late)
    naive = goodput_of([m for m in seen_late if not isinstance(m, GoodputSoFar)])
    assert naive.goodput < truth.goodput - 0.3
