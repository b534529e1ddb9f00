"""The real app on a run of 1024 ranks (8 nodes x 128) through its normal message path: the node
rows, Enter into a node and Escape back, the straggler named and its node first, a hung rank in the
banner, the filter. Replayed messages, then stall reports posted as the receive thread posts them."""

from __future__ import annotations

import hang_scenario as hs
import pytest
import scale_scenario as sc
from textual.widgets import DataTable, Static
from ui_waits import eventually, repainted

from ringtop.tui.app import RingtopApp
from ringtop.tui.sources.feeds import TelemetryBatch

SIZE = (160, 48)
STEPS = 12


def text(app: RingtopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def row_keys(app: RingtopApp) -> list[str]:
    return [k.value for k in app.query_one("#ranks", DataTable).rows]


async def loaded(pilot, app: RingtopApp) -> None:
    await eventually(pilot, lambda: _assert(app.replay_loaded), timeout_s=30)
    await repainted(pilot)


def _assert(ok: bool) -> None:
    assert ok


@pytest.mark.timeout(60)
async def test_1024_ranks_show_node_rows_the_straggler_and_a_nodes_ranks():
    app = RingtopApp(messages=sc.run(steps=STEPS), source="runs/scale")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)

        def nodes():
            keys = row_keys(app)
            assert keys[0] == "nnode-4" and sorted(keys) == [f"nnode-{i}" for i in range(8)]  # the straggler's first
            assert "8 nodes · 1,024 ranks" in text(app, "#table-caption")
            standouts = text(app, "#standouts")
            assert "▲ longest steps: r517 node-4 130.0 ms +30%" in standouts
            assert "step time r517" in standouts
            assert "heat: 1 cell per rank" in text(app, "#heat-strip")
            assert app.query_one("#step-chart").region.bottom <= app.query_one("#alert").region.y  # all on screen
            assert app.query_one("#alert").region.bottom <= SIZE[1]
        await eventually(pilot, nodes)
        await pilot.press("enter")

        def opened():
            keys = row_keys(app)
            assert keys[0] == f"r{sc.STRAGGLER}" and all(512 <= int(k[1:]) < 640 for k in keys)
            assert "node node-4: 128 ranks" in text(app, "#table-caption")
        await eventually(pilot, opened)
        await pilot.press("pagedown")
        await eventually(pilot, lambda: _assert(f"r{sc.STRAGGLER}" not in row_keys(app)))
        await pilot.press("escape")
        await eventually(pilot, lambda: _assert(row_keys(app)[0] == "nnode-4"))
        await pilot.press("down", "enter")  # the second node: node-0 (the others tie, in host order)
        await eventually(pilot, lambda: _assert("node node-0" in text(app, "#table-caption")))
        await pilot.press("escape", "o")  # sorted by memory now
        await eventually(pilot, lambda: _assert("by memory" in text(app, "#table-caption")))


@pytest.mark.timeout(60)
async def test_a_hung_rank_among_1024_is_in_the_banner_the_strip_and_its_node_row():
    seq = hs.Seq()
    app = RingtopApp(messages=sc.run(steps=STEPS, seq=seq), source="runs/scale")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.post_message(TelemetryBatch(sc.hung_reports(seq, steps=STEPS), []))  # as the receive thread does

        def hung():
            banner = text(app, "#hang-banner")
            assert f"rank {sc.HUNG} has not entered all_reduce" in banner
            assert f"✖ hung: rank {sc.HUNG} holding up" in text(app, "#health")
            assert "⏸" in text(app, "#heat-strip")
            table = app.query_one("#ranks", DataTable)
            assert "1 hung" in str(table.get_cell("nnode-5", "note"))
            assert row_keys(app)[0] == "nnode-5"  # first, above the straggler's node the step sort puts first
        await repainted(pilot)
        await eventually(pilot, hung)
        await pilot.press("slash")
        await pilot.press(*str(sc.HUNG), "enter")

        def filtered():
            assert row_keys(app) == [f"r{sc.HUNG}"]
            assert "filter '700': 1 of 1,024 ranks" in text(app, "#table-caption")
            # its own row says so (it was a healthy-looking row: its last step, its time, no note)
            note = str(app.query_one("#ranks", DataTable).get_cell(f"r{sc.HUNG}", "note"))
            assert note == "✖ hung: the others wait for it", note
        await eventually(pilot, filtered)
