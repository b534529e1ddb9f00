"""The Comm tab: per collective kind, the chart of bus bandwidth, exposed time, per rank, verdicts."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from ringtop.tui.tabs.comm.model import CommModel
from ringtop.tui.widgets.drawing import Drawn, TableWidth
from ringtop.tui.widgets.fast_table import FastTable
from ringtop.tui.widgets.spark import Spark


class CommPanel(TableWidth, VerticalScroll):
    DEFAULT_CSS = """
    CommPanel { height: 1fr; }
    CommPanel .caption { height: auto; margin: 0 1; }
    CommPanel #comm-kinds { height: auto; max-height: 12; }
    CommPanel .comm-chart { height: 1; margin: 0 1; }
    CommPanel #comm-chart-label { width: auto; max-width: 70; padding: 0 2 0 0; }
    CommPanel #comm-spark { width: 1fr; }
    CommPanel #comm-exposed { height: auto; margin: 0 1; }
    CommPanel #comm-ranks { height: auto; max-height: 50%; margin: 1 0 0 0; }
    CommPanel .scale-line { height: auto; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    CommPanel #comm-table-caption { margin: 1 1 0 1; }
    CommPanel #verdicts { height: auto; margin: 1 1 0 1; padding: 0 1; border-left: thick $warning; }
    """
    TABLE_SHARE = 0.5
    """Of the panel, what a large run's ranks table may take (its max-height)."""

    def __init__(self) -> None:
        super().__init__(id="comm-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="comm-caption", classes="caption")
        yield FastTable(id="comm-kinds", cursor_type="none", zebra_stripes=True)
        with Horizontal(classes="comm-chart"):
            yield Static(id="comm-chart-label")
            yield Spark(id="comm-spark")
        yield Static(id="comm-exposed")
        yield Static(id="comm-table-caption", classes="scale-line")
        table = FastTable(id="comm-ranks", cursor_type="none", zebra_stripes=True)
        table.can_focus = False  # the app's keys move through a large run's rows (only those on screen exist)
        yield table
        yield Static(id="comm-standouts", classes="scale-line")
        yield Static(id="verdicts")

    def show(self, model: CommModel) -> None:
        d = self._drawn
        d.text(self.query_one("#comm-caption", Static), model.caption)
        d.table(self.query_one("#comm-kinds", DataTable), model.kinds_columns, model.kinds_rows)
        d.text(self.query_one("#comm-chart-label", Static), model.chart_label)
        self.query_one("#comm-spark", Spark).data = model.chart
        d.text(self.query_one("#comm-exposed", Static), model.exposed)
        d.optional_text(self.query_one("#comm-table-caption", Static), model.table_caption)
        table = self.query_one("#comm-ranks", DataTable)
        d.table(table, model.ranks_columns, model.ranks_rows)
        d.cursor(table, model.cursor)
        d.optional_text(self.query_one("#comm-standouts", Static), model.standouts)
        d.text(self.query_one("#verdicts", Static), model.verdicts)
