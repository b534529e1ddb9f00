"""FastTable draws exactly what Textual's DataTable draws (every character and its style, meta
included), on the same app, for the cells the UI gives it; a changed cell is drawn anew."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App
from textual.widgets import DataTable

from ringtop.tui.tables import Column, SyncedTable
from ringtop.tui.widgets import fast_table
from ringtop.tui.widgets.fast_table import FastTable

COLUMNS = [Column("rank", "rank", 5, True), Column("host", "host", 8), Column("step", "step ms", 7, True),
           Column("mid", "mid", 6), Column("note", "note", 10)]


def rows(scale: float) -> list[tuple[str, dict[str, Text]]]:
    out = []
    for i in range(6):
        mid = Text("ab", style="italic")
        mid.justify = "center"  # SyncedTable sets left / right; the others are drawn the same way
        out.append((f"r{i}", {
            "rank": Text(str(i)),
            "host": Text(f"node-{i:03d}-a-long-name", style="bold"),
            "step": Text(f"{i * scale:.1f}", style="yellow" if i % 2 else ""),
            "mid": mid,
            "note": Text.assemble(("✖ ", "bold red"), ("dead 日本語", "dim")) if i % 3 == 0 else Text("", style="dim"),
        }))
    return out


class Pair(App):
    def compose(self):
        yield DataTable(id="textual", zebra_stripes=True, cursor_type="row")
        yield FastTable(id="fast", zebra_stripes=True, cursor_type="row")


def drawn(table: DataTable, lines: int) -> list[list[tuple[str, object]]]:
    return [[(ch, seg.style) for seg in table.render_line(y) for ch in seg.text] for y in range(lines)]


def plain(lines: list) -> list[str]:
    return ["".join(ch for ch, _ in line) for line in lines]


async def draw_both(scale: float, focused: bool, cursor: int) -> tuple[list, list, list[str], list[str]]:
    """(DataTable's lines, FastTable's, FastTable's text before and after a change of cells)."""
    app = Pair()
    async with app.run_test(size=(64, 30)) as pilot:
        tables = [SyncedTable(app.query_one(f"#{name}", DataTable)) for name in ("textual", "fast")]
        for synced in tables:
            synced.table.can_focus = focused
            synced.set_columns(COLUMNS)
            synced.set_rows(rows(1.5))
        app.set_focus(None)  # the app gives the first table focus on start
        await pilot.pause()
        before = plain(drawn(tables[1].table, 8))  # drawn (and kept) before the cells change
        for synced in tables:  # cells changed in place (SyncedTable's update_cell), then the cursor
            synced.set_rows(rows(scale))
            synced.table.move_cursor(row=cursor, animate=False)
        if focused:
            app.set_focus(tables[0].table)
        await pilot.pause()
        ours, theirs = drawn(tables[1].table, 8), drawn(tables[0].table, 8)
        if focused:  # the focus styles the table that has it: draw ours with it too
            app.set_focus(tables[1].table)
            await pilot.pause()
            ours = drawn(tables[1].table, 8)
        return theirs, ours, before, plain(ours)


@pytest.mark.parametrize("focused", [False, True])
async def test_fast_table_draws_what_datatable_draws_and_a_changed_cell_anew(focused):
    theirs, ours, before, after = await draw_both(2.5, focused, cursor=2)
    assert ours == theirs
    assert "node-00…" in after[1] and "✖ dead 日…" in after[1]
    assert "7.5" in before[6] and "12.5" in after[6] and "7.5" not in after[6]


async def test_the_comparison_catches_a_cell_drawn_without_its_base_style(monkeypatch):
    class Unjoined:
        @staticmethod
        def join(lines):
            return lines[0]  # Text.render alone leaves a Text's own style out

    monkeypatch.setattr(fast_table, "_JOINER", Unjoined)
    theirs, ours, _, _ = await draw_both(2.5, False, cursor=2)
    assert ours != theirs


async def test_the_drawn_cells_are_bounded_while_every_cell_changes_and_the_shown_ones_stay_drawn(monkeypatch):
    """Thirty passes of all-new cells (35 a pass with the header) with the cache's turn at 40
    cells: at most two generations (80) are held, not every cell ever drawn (~1,000); the drawing
    still equals DataTable's; and a pass over unchanged cells draws none anew, across turns."""
    monkeypatch.setattr(fast_table, "MAX_CACHED_CELLS", 40)
    app = Pair()
    async with app.run_test(size=(64, 30)) as pilot:
        tables = [SyncedTable(app.query_one(f"#{name}", DataTable)) for name in ("textual", "fast")]
        for synced in tables:
            synced.set_columns(COLUMNS)
        app.set_focus(None)
        fast = tables[1].table
        for scale in range(30):
            for synced in tables:
                synced.set_rows(rows(1.0 + scale))
            await pilot.pause()
            ours = drawn(fast, 8)
            assert len(fast._drawn_cells) + len(fast._drawn_before) <= 80
        assert ours == drawn(tables[0].table, 8)
        draws = []
        original = fast._draw
        monkeypatch.setattr(fast, "_draw", lambda *a: draws.append(a) or original(*a))
        for _ in range(3):
            fast._line_cache.clear()  # DataTable's own line cache: every line through _render_cell
            assert drawn(fast, 8) == ours
        assert draws == []
