"""A UI that attaches mid-run draws its charts from the relay's recent steps, not from nothing:
rank 0's real relay (CURVE, real sockets) keeps each rank's last steps and hands them to every new
subscriber (RecentSteps) after the cached Hellos. A UI already attached gets them too and folds
none twice; the expected points are the steps the test sent, counted independently."""

from __future__ import annotations

import msgspec
import pytest
from background_socket import drain, framed, relay_with_ranks, subscribed, subscriber
from test_tui_app import header_text, make_hello, make_step, wait_until
from ui_waits import repainted

from ringtop.agent.transport.relay import recent_steps_per_rank
from ringtop.protocol import RecentSteps, Step, StepBrief
from ringtop.tui.app import RingtopApp
from ringtop.tui.state.view_model import RunView

pytestmark = pytest.mark.timeout(60)
STEPS = 30


def the_run() -> list:
    msgs = [make_hello(r, 0, 1000.0) for r in (0, 1)]
    msgs += [make_step(r, n, n, 1000.0 + n) for n in range(1, STEPS + 1) for r in (0, 1)]
    return msgs


def folded(msgs: list) -> RunView:
    view = RunView(watch_liveness=False)
    for m in msgs:
        view.apply(m, now=1.0)
    return view


def test_each_rank_keeps_its_last_steps_within_a_budget():
    assert recent_steps_per_rank(2) == 120 and recent_steps_per_rank(1024) == 32
    assert recent_steps_per_rank(100_000) == 8 and recent_steps_per_rank(None) == 120


async def test_a_ui_attaching_mid_run_starts_its_charts_from_the_relays_recent_steps(gatekeeper):
    gate, keys = gatekeeper
    run = the_run()
    with relay_with_ranks(gate, keys, "7f3a9c21") as (_, publish_addr, pubs):
        early = subscriber(publish_addr, keys.client)
        late = None
        try:
            seen_early: list = []
            for rank in (0, 1):
                subscribed(early, pubs[rank], run[rank], seen_early)
            # step by step: two sockets' frames reach the relay in no set order, and a rank more
            # than STEP_LAG steps ahead closes the chart's points without the other
            for n, pair in enumerate(zip(run[2::2], run[3::2]), start=1):
                for msg in pair:
                    pubs[msg.rank].send_multipart(framed(msg))
                drain(early, seen_early, lambda got, n=n: sum(isinstance(m, Step) for m in got) == 2 * n)

            late = subscriber(publish_addr, keys.client)
            seen_late: list = []
            drain(late, seen_late, lambda got: any(isinstance(m, RecentSteps) for m in got))
            # the early subscriber got the replay too (it is a PUB): it must not count those steps twice
            drain(early, seen_early, lambda got: any(isinstance(m, RecentSteps) for m in got))

            app = RingtopApp(publish_addr=publish_addr, keys=keys.client)
            async with app.run_test(size=(140, 40)) as pilot:
                await wait_until(
                    pilot,
                    lambda: [r.step for r in app.view.rows()] == [STEPS, STEPS],
                    what="the ranks' steps from the relay",
                )
                await repainted(pilot)
                assert f"step {STEPS}/50" in header_text(app)
                assert len(app.view.step_history.points) >= STEPS - 1  # the charts start full
        finally:
            for sock in (early, *([late] if late is not None else [])):
                sock.close(0)

    assert not any(isinstance(m, Step) for m in seen_late), "the late subscriber saw no step live"
    steps = list(range(1, STEPS + 1))
    for seen in (seen_early, seen_late):
        view = folded(seen)
        assert [p.step for p in view.step_history.points][: STEPS - 1] == steps[: STEPS - 1]
        assert [len(r.step_ms_history) for r in view.rows()] == [STEPS, STEPS]
        assert [r.step for r in view.rows()] == [STEPS, STEPS]
        # rank 1's step time (make_step: 100 + 20 x rank ms) is the slowest of each point
        assert {p.max_ms for p in view.step_history.points} == {120.0}
    # without the replay the late UI has no step to draw: the check bites
    bare = folded([m for m in seen_late if not isinstance(m, RecentSteps)])
    assert not bare.step_history.points and [r.step for r in bare.rows()] == [-1, -1]


def test_a_step_in_transit_when_the_recent_steps_came_is_folded_once():
    """A UI subscribing while rank 0's step 1 is in flight gets it twice: in RecentSteps' briefs and
    then whole, before any digest. Its histories hold it once; the row takes the whole step's
    readings (a 64-rank simulated run caught step 1 counted twice)."""
    def brief_then_whole(fold_whole_again: bool) -> RunView:
        view = RunView(watch_liveness=False)
        view.apply(make_hello(0, 0, 1000.0), now=1.0)
        view.apply(RecentSteps(rank=-1, ts=1001.5, briefs=[StepBrief(0, 1, 1001.0, 100.0, 2.99, None)]), now=1.0)
        whole = make_step(0, 1, 1, 1001.0, step_ms=130.0)
        if fold_whole_again:
            view.ranks[0].folded_step = 0  # the rule before: only digests were held against it
        view.apply(whole, now=1.0)
        view.apply(make_step(0, 2, 2, 1002.0), now=1.0)
        return view

    view = brief_then_whole(False)
    row = view.ranks[0]
    assert [p.step for p in view.step_history.points] == [1, 2]
    assert len(row.step_ms_history) == 2 and row.step == 2
    assert row.latest is not None and row.latest.step == 2
    again = brief_then_whole(True)
    assert len(again.ranks[0].step_ms_history) == 3  # the check bites


def test_a_rank_that_dies_before_the_ui_saw_a_step_of_it_is_not_at_step_minus_one():
    """Re-attached to a run whose rank 1 then went silent: the UI has its Hello, no step."""
    view = RunView(stale_after_s=3.0)
    view.apply(make_hello(0, 0, 1000.0), now=0.0)
    view.apply(msgspec.structs.replace(make_hello(1, 0, 1000.0), host="node-0"), now=0.0)  # one node: not cut off
    for n in range(1, 80):
        view.apply(make_step(0, n, n, 1000.0 + n / 10), now=n / 10)
        view.tick(n / 10)
    assert view.ranks[1].dead and view.ranks[1].step == -1
    said = [e.text for e in view.events if "rank 1" in e.text] + [view.failure or ""]
    assert any("before any step this UI saw" in t for t in said), said
    assert not any("step -1" in t for t in said), said
