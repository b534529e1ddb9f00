"""The liveness readings on screen (metrics/rules/liveness.py): the Hang view's ↑↓ through the real app
and a Pilot while stall reports keep arriving, one wait on one screen."""

from __future__ import annotations

import hang_scenario as hs
from textual.widgets import DataTable, Static
from ui_waits import eventually, repainted

from ringtop.tui.app import RingtopApp


def text_of(app: RingtopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def cell(app: RingtopApp, row: str, column: str) -> str:
    return " ".join(str(app.query_one("#hang-ranks", DataTable).get_cell(row, column)).split())


async def test_hang_view_arrows_change_the_stack_shown_and_it_stays_while_reports_arrive():
    seq = hs.Seq()
    app = RingtopApp(messages=hs.hung_run(seq=seq), source="runs/hang")
    async with app.run_test(size=(160, 40)) as pilot:
        await eventually(pilot, lambda: app.replay_loaded)
        await pilot.press("6")
        await repainted(pilot)
        await eventually(pilot, lambda: text_of(app, "#hang-stack").startswith("rank 3"))
        await pilot.press("down")
        await eventually(pilot, lambda: text_of(app, "#hang-stack").startswith("rank 0"))
        await pilot.press("down")
        await eventually(pilot, lambda: text_of(app, "#hang-stack").startswith("rank 1"))
        for k in (3, 4):  # the next rounds of reports, as a live run sends them every 2 s
            for r in range(4):
                app.view.apply(hs.stall(r, seq(r), k=k))
            await repainted(pilot)
            await pilot.pause(0.2)
            assert text_of(app, "#hang-stack").startswith("rank 1"), text_of(app, "#hang-stack")[:80]
            assert app.query_one("#hang-ranks", DataTable).cursor_row == 2
            wait_s = hs.stall(0, 0, k=k).in_flight[0].age_s  # one wait, on the caption and in the cells
            assert f"waited in for {wait_s:.0f} s" in text_of(app, "#hang-caption")
            assert cell(app, "h0", "state") == f"waits {wait_s:.0f} s"
        await pilot.press("up")
        await eventually(pilot, lambda: text_of(app, "#hang-stack").startswith("rank 0"))


async def test_the_hang_views_cursor_stays_on_the_rank_whose_stack_it_shows_when_rows_reorder():
    seq = hs.Seq()
    app = RingtopApp(messages=hs.hung_run(seq=seq), source="runs/hang")
    async with app.run_test(size=(160, 40)) as pilot:
        await eventually(pilot, lambda: app.replay_loaded)
        await pilot.press("6")
        await repainted(pilot)
        table = app.query_one("#hang-ranks", DataTable)
        await eventually(pilot, lambda: [k.value for k in table.rows] == ["h3", "h0", "h1", "h2"])
        await pilot.press("down", "down")
        await eventually(pilot, lambda: text_of(app, "#hang-stack").startswith("rank 1"))
        app.view.apply(hs.failed_bye(0, seq(0)))  # rank 0 ends: it no longer waits, its row goes last
        await repainted(pilot)
        await eventually(pilot, lambda: [k.value for k in table.rows] == ["h3", "h1", "h2", "h0"])
        await repainted(pilot)

        def on_rank_1():
            row_key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
            assert row_key == "h1" and text_of(app, "#hang-stack").startswith("rank 1"), row_key

        await eventually(pilot, on_rank_1)
