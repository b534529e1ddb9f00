"""A node the UI stops hearing while the other nodes step on (its node relay died, or the link to the
head was cut): named unreachable — on the health line, in the small run's hosts caption, in a large
run's node row — not as ranks that stalled; and unmarked once it is heard again. The view model
with its own clock, then the real app fed as its receive thread feeds it."""

from __future__ import annotations

import hang_scenario as hs
import msgspec
import pytest
import scale_scenario as sc
from textual.widgets import DataTable, Static

from ringtop.protocol import Heartbeat, free_tcp_port
from ringtop.tui.app import RingtopApp
from ringtop.tui.sources.feeds import TelemetryBatch
from ringtop.tui.state.health import health_line
from ringtop.tui.state.nodes import nodes_cut_off
from ringtop.tui.state.view_model import RunView

STALE_S = 3.0
NODE_B = (2, 3)
"""hang_scenario's second host, node-1."""


def small_view(watch_liveness: bool = True) -> tuple[RunView, hs.Seq]:
    view, seq = RunView(stale_after_s=STALE_S, watch_liveness=watch_liveness), hs.Seq()
    for r in range(4):
        view.apply(hs.hello(r), now=0.0)
    for n in range(1, 4):
        for r in range(4):
            view.apply(sc.step(r, n, seq(r), world=4), now=n * 0.1)
    return view, seq


def step_on(view: RunView, seq: hs.Seq, ranks, until_s: float) -> None:
    """The given ranks keep stepping (and are heard) up to `until_s` on the view's clock."""
    n, t = 4, 0.5
    while t <= until_s:
        for r in ranks:
            view.apply(sc.step(r, n, seq(r), world=4), now=t)
        n, t = n + 1, t + 0.5
    view.tick(until_s)


def test_a_silent_node_among_heard_ones_is_cut_off_not_stalled():
    view, seq = small_view()
    step_on(view, seq, (0, 1), until_s=12.0)
    (node,) = nodes_cut_off(view)
    assert node.host == "node-1" and node.ranks == NODE_B and node.silent_s == pytest.approx(12.0 - 0.3)
    health = health_line(view, 12.0).plain
    assert "✖ node node-1 unreachable: ranks 2, 3 silent 12 s" in health
    assert "rank 2: no step" not in health and "rank 3: no step" not in health  # not read as stalled
    assert not any(view.ranks[r].dead for r in NODE_B) and "dead" not in health  # nor as dead


def test_a_node_heard_again_is_no_longer_cut_off():
    view, seq = small_view()
    step_on(view, seq, (0, 1), until_s=12.0)
    assert nodes_cut_off(view)
    for r in NODE_B:
        view.apply(Heartbeat(rank=r, seq=seq(r), ts=hs.T0 + 13), now=12.5)
    view.tick(12.6)
    assert nodes_cut_off(view) == []
    assert "unreachable" not in health_line(view, 12.6).plain


def test_every_node_silent_is_the_uis_own_link_and_one_host_is_no_node_question():
    view, seq = small_view()
    view.tick(20.0)
    assert nodes_cut_off(view) == []  # nothing heard from anyone: the header says stale
    one_host, seq1 = RunView(stale_after_s=STALE_S), hs.Seq()
    for r in range(4):
        one_host.apply(msgspec.structs.replace(hs.hello(r), host="solo"), now=0.0)
    step_on(one_host, seq1, (0, 1), until_s=12.0)
    assert nodes_cut_off(one_host) == []  # silent ranks on the only host: dead, as always
    assert "✖ ranks 2, 3 dead" in health_line(one_host, 12.0).plain


def test_a_replay_says_nothing_of_reachability():
    view, seq = small_view(watch_liveness=False)
    step_on(view, seq, (0, 1), until_s=12.0)
    assert nodes_cut_off(view) == []


def text(app: RingtopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def live_app() -> RingtopApp:
    """Live, as `ringtop ui` is; nothing listens at its address, the test posts what its receive
    thread would."""
    return RingtopApp(publish_addr=f"tcp://127.0.0.1:{free_tcp_port()}", stale_after_s=1.0)


async def feed_until(pilot, app: RingtopApp, batch, check, steps: int = 150) -> None:
    """Post `batch(n)` for steps n = 1, 2, … every 0.1 s, as the receive thread would, until
    `check` holds (bounded: its last failure is raised)."""
    for n in range(1, steps + 1):
        app.post_message(TelemetryBatch(batch(n), []))
        await pilot.pause(0.1)
        try:
            check()
            return
        except (AssertionError, LookupError):  # LookupError: a table row not drawn yet
            if n == steps:
                raise


@pytest.mark.timeout(60)
async def test_the_app_names_a_cut_off_node_and_clears_it_when_heard_again():
    app, seq = live_app(), hs.Seq()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_message(TelemetryBatch([hs.hello(r) for r in range(4)], []))
        steps = iter(range(1, 10**6))

        def of(ranks):
            return lambda _: [sc.step(r, n, seq(r), world=4) for n in [next(steps)] for r in ranks]

        def both_heard():
            assert text(app, "#table-caption") == "2 nodes: node-0 ranks 0, 1 · node-1 ranks 2, 3"
            assert "unreachable" not in text(app, "#health")

        def cut_off():
            assert "✖ node node-1 unreachable: ranks 2, 3 silent" in text(app, "#health")
            assert text(app, "#table-caption").endswith("node-1 ranks 2, 3 ✖ unreachable")
        await feed_until(pilot, app, of(range(4)), both_heard)
        await feed_until(pilot, app, of((0, 1)), cut_off)
        await feed_until(pilot, app, of(range(4)), both_heard)


@pytest.mark.timeout(90)
async def test_a_cut_off_node_among_1024_ranks_is_its_rows_note():
    app, seq = live_app(), hs.Seq()
    cut = sc.HUNG // sc.PER_NODE  # node-5
    heard = [r for r in range(sc.WORLD) if r // sc.PER_NODE != cut]
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_message(TelemetryBatch([sc.hello(r) for r in range(sc.WORLD)], []))

        def note(host: str) -> str:
            return str(app.query_one("#ranks", DataTable).get_cell(f"n{host}", "note"))

        def cut_off():
            assert note(f"node-{cut}") == "✖ unreachable"
            assert all(note(f"node-{i}") == "" for i in range(sc.NODES) if i != cut)
            first = cut * sc.PER_NODE
            assert f"✖ node node-{cut} unreachable: ranks {first}–{first + sc.PER_NODE - 1} silent" in \
                text(app, "#health")
        await feed_until(pilot, app, lambda n: [sc.step(r, n, seq(r)) for r in (range(sc.WORLD) if n < 3 else heard)],
                         cut_off)
