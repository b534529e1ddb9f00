"""The Overview's health line: healthy, or what is wrong and where — from real protocol messages
through the real view model, on a clock the test sets; and through the real app and a Pilot."""

from __future__ import annotations

from textual.widgets import Static
from ui_waits import eventually

from ringtop.metrics.rules import liveness
from ringtop.protocol import Event, Heartbeat, Hello, Step
from ringtop.tui.app import RingtopApp
from ringtop.tui.state.health import health_line, stalled_ranks
from ringtop.tui.state.view_model import RunView


def two_ranks_stepping(view: RunView, steps: int, step_s: float = 0.1, start: float = 100.0) -> float:
    """Both ranks say hello and finish `steps` steps of `step_s` each; returns the clock after."""
    for r in (0, 1):
        view.apply(Hello(rank=r, seq=0, ts=1000.0, run_id="h", world_size=2, strategy="ddp"), now=start)
    now = start
    for n in range(1, steps + 1):
        now = start + n * step_s
        for r in (0, 1):
            view.apply(Step(rank=r, seq=n, ts=1000.0 + n * step_s, step=n, loss=2.0, step_ms=step_s * 1e3), now=now)
    return now


def test_a_healthy_run_says_so():
    view = RunView()
    now = two_ranks_stepping(view, 20)
    view.tick(now)
    line = health_line(view, now).plain
    assert line.startswith("● healthy") and "2 ranks" in line and "step 20" in line


def test_a_rank_that_heartbeats_but_finishes_no_step_is_named_with_its_last_step():
    """As a rank hung in a collective looks: its heartbeat thread goes on, its steps stop."""
    view = RunView()
    now = two_ranks_stepping(view, 20)  # 100 ms steps: 2 x 0.1 s + the 4 s floor + 2 s for delivery
    seq, n = {0: 21, 1: 21}, 20
    limit_s = 2 * 0.1 + 4.0 + 2.0
    assert liveness.ui_stall_after_s(0.1) == limit_s
    for t in range(1, 15):  # rank 0 keeps stepping; rank 1 only heartbeats, every second
        now += 1.0
        for _ in range(10):
            n += 1
            view.apply(Step(rank=0, seq=seq[0], ts=1000.0 + now, step=n, loss=2.0, step_ms=100.0), now=now)
            seq[0] += 1
        view.apply(Heartbeat(rank=1, seq=seq[1], ts=1000.0 + now, step=20), now=now)
        seq[1] += 1
        view.tick(now)
        stalls = stalled_ranks(view, now)
        if t <= limit_s:
            assert stalls == [], f"{t} s after its last step is not a stall yet"
        else:
            assert [(s.rank, s.step) for s in stalls] == [(1, 20)]
    line = health_line(view, now).plain
    assert "rank 1: no step for 14 s (last 20)" in line, line
    assert not line.startswith("● healthy")
    assert not any(r.dead for r in view.ranks.values()), "heard from: stalled, not dead"


def test_a_slow_rank_waits_longer_before_it_is_called_stalled():
    view = RunView()
    now = two_ranks_stepping(view, 10, step_s=4.0)  # 4 s steps: 2 x 4 + 4 + 2 = 14 s, past 6.2 s
    for _ in range(13):
        now += 1.0
        view.apply(Heartbeat(rank=0, seq=99, ts=2000.0, step=10), now=now)
        view.apply(Heartbeat(rank=1, seq=99, ts=2000.0, step=10), now=now)
    assert stalled_ranks(view, now) == [], "13 s is under twice a 4-second step plus the floors"
    for _ in range(2):
        now += 1.0
        view.apply(Heartbeat(rank=0, seq=99, ts=2000.0, step=10), now=now)
        view.apply(Heartbeat(rank=1, seq=99, ts=2000.0, step=10), now=now)
    assert [s.rank for s in stalled_ranks(view, now)] == [0, 1]


def test_verdicts_dead_ranks_and_lost_messages_are_named_worst_first():
    view = RunView()
    now = two_ranks_stepping(view, 5)
    view.apply(Event(rank=0, seq=10, ts=1001.0, level="warn", kind="verdict", text="rank 1 is a straggler",
                     data={"rule": "straggler", "rank": 1}), now=now)
    view.apply(Step(rank=1, seq=9, ts=1002.0, step=6, loss=2.0, step_ms=100.0, drops=7), now=now)  # seq gap too
    view.tick(now)
    line = health_line(view, now).plain
    assert "⚠ straggler (rank 1)" in line and "telemetry messages lost" in line
    for r in (0, 1):
        view.ranks[r].dead = r == 1
    line = health_line(view, now).plain
    assert line.startswith("✖ rank 1 dead"), line


def test_a_replay_never_calls_a_rank_stalled():
    view = RunView(watch_liveness=False)
    two_ranks_stepping(view, 5)
    assert stalled_ranks(view, now=10_000.0) == []


async def test_the_health_line_heads_the_overview_at_100_by_30():
    msgs = [Hello(rank=r, seq=0, ts=1000.0, run_id="h", world_size=2, strategy="ddp") for r in (0, 1)]
    msgs += [Step(rank=r, seq=n, ts=1000.0 + n, step=n, loss=2.0, step_ms=100.0) for n in range(1, 6) for r in (0, 1)]
    msgs.append(Event(rank=0, seq=6, ts=1006.0, level="warn", kind="verdict", text="communication-bound",
                      data={"rule": "comm_bound"}))
    app = RingtopApp(messages=msgs)
    async with app.run_test(size=(100, 30)) as pilot:
        def shown():
            health = app.query_one("#health", Static)
            assert "⚠ communication-bound" in str(health.content) and "comm_bound" not in str(health.content)
            assert health.region.y < app.query_one("#ranks").region.y, "above the rank table"
            assert health.region.height == 1 and health.region.width > 0
        await eventually(pilot, shown)


def test_a_ui_attached_to_a_hung_run_names_the_stall_and_draws_no_loss_it_never_got():
    """Issue 13: attached 80 s after rank 1 hung at step 14, the UI said live, step 14, loss nan for
    both ranks. Both ranks only heartbeat (rank 0 waits in the collective rank 1 never joined)."""
    view = RunView()
    for r in (0, 1):  # the relay's cached hellos, then heartbeats only
        view.apply(Hello(rank=r, seq=0, ts=1000.0, run_id="h", world_size=2, strategy="ddp"), now=50.0)
    for t in range(0, 13):
        for r in (0, 1):
            view.apply(Heartbeat(rank=r, seq=100 + t, ts=1080.0 + t, step=14), now=50.0 + t)
    view.tick(62.0)
    line = health_line(view, 62.0).plain
    assert "rank 0: no step in the 12 s since this UI attached (last 14)" in line, line
    assert "rank 1: no step in the 12 s" in line

    # a fresh run whose first step takes long is not a stall
    fresh = RunView()
    for r in (0, 1):
        fresh.apply(Hello(rank=r, seq=0, ts=1000.0, run_id="f", world_size=2, strategy="ddp"), now=0.0)
        fresh.apply(Heartbeat(rank=r, seq=1, ts=1030.0, step=0), now=30.0)
    warmup_s = liveness.WARMUP_S + liveness.DELIVERY_S
    assert stalled_ranks(fresh, warmup_s - 1.0) == [] and stalled_ranks(fresh, warmup_s + 1.0) != []


async def test_the_overview_draws_no_loss_for_a_rank_it_has_no_step_of():
    msgs = [Hello(rank=r, seq=0, ts=1000.0, run_id="h", world_size=2, strategy="ddp") for r in (0, 1)]
    msgs += [Heartbeat(rank=1, seq=1, ts=1001.0, step=14),
             Step(rank=0, seq=1, ts=1001.0, step=15, loss=None, step_ms=100.0)]  # rank 0: a non-finite loss
    app = RingtopApp(messages=msgs)
    async with app.run_test(size=(160, 40)) as pilot:
        from textual.widgets import DataTable

        def cells():
            table = app.query_one("#ranks", DataTable)
            assert str(table.get_cell("r1", "loss")) == "-", "never received: no value, not NaN"
            assert str(table.get_cell("r0", "loss")) == "nan", "reported non-finite: shown as such"
            assert str(table.get_cell("r1", "step")) == "14"
        await eventually(pilot, cells)
