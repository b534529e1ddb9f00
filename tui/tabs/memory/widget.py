"""The Memory tab: what each rank holds (state by the agent's count, the rest measured), and
which strategy would fit, from the one cost model."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from ringtop.tui.tabs.memory.model import MemoryModel
from ringtop.tui.widgets.drawing import Drawn, TableWidth
from ringtop.tui.widgets.fast_table import FastTable


class MemoryPanel(TableWidth, VerticalScroll):
    DEFAULT_CSS = """
    MemoryPanel { height: 1fr; }
    MemoryPanel .caption { height: auto; margin: 0 1; }
    MemoryPanel #fit-caption { margin: 1 1 0 1; }
    MemoryPanel #mem-ranks { height: auto; max-height: 60%; }
    MemoryPanel .scale-line { height: auto; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    MemoryPanel #fit { height: auto; }
    """
    TABLE_SHARE = 0.6
    """Of the panel, what a large run's table may take (its max-height)."""

    def __init__(self) -> None:
        super().__init__(id="memory-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="mem-caption", classes="caption")
        yield Static(id="mem-table-caption", classes="scale-line")
        table = FastTable(id="mem-ranks", cursor_type="none", zebra_stripes=True)
        table.can_focus = False  # the app's keys move through a large run's rows (only those on screen exist)
        yield table
        yield Static(id="mem-standouts", classes="scale-line")
        yield Static(id="fit-caption", classes="caption")
        yield FastTable(id="fit", cursor_type="none")

    def show(self, model: MemoryModel) -> None:
        d = self._drawn
        d.text(self.query_one("#mem-caption", Static), model.caption)
        d.optional_text(self.query_one("#mem-table-caption", Static), model.table_caption)
        table = self.query_one("#mem-ranks", DataTable)
        d.table(table, model.columns, model.rows)
        d.cursor(table, model.cursor)
        d.optional_text(self.query_one("#mem-standouts", Static), model.standouts)
        d.text(self.query_one("#fit-caption", Static), model.fit_caption)
        d.table(self.query_one("#fit", DataTable), model.fit_columns, model.fit_rows)
