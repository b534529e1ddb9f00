"""The Overview: the hang banner (while ranks are stuck), the health line, one row per rank, the
step-part legend, the charts, alerts."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from ringtop.tui.tabs.hang.widget import HangBanner
from ringtop.tui.tabs.overview.model import ChartModel, OverviewModel
from ringtop.tui.widgets.drawing import Drawn, TableWidth
from ringtop.tui.widgets.fast_table import FastTable
from ringtop.tui.widgets.spark import Spark


class Chart(Vertical):
    """A titled sparkline with its y-axis' max and min beside it, one column per step (spark.py)."""

    DEFAULT_CSS = """
    Chart { height: 1fr; min-height: 3; margin: 0 1; }
    Chart .chart-title { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    Chart Horizontal { height: 1fr; }
    Chart .chart-axis { width: 9; height: 1fr; }
    Chart .axis-top { height: 1fr; text-align: right; padding: 0 1 0 0; color: $text-muted; }
    Chart .axis-bottom { height: 1; text-align: right; padding: 0 1 0 0; color: $text-muted; }
    Chart Spark { width: 1fr; height: 1fr; }
    """

    def __init__(self, name: str) -> None:
        super().__init__(id=f"{name}-chart")
        self._series = name
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id=f"{self._series}-label", classes="chart-title")
        with Horizontal():
            with Vertical(classes="chart-axis"):
                yield Static(classes="axis-top")
                yield Static(classes="axis-bottom")
            yield Spark(id=f"{self._series}-spark")

    def show(self, model: ChartModel) -> None:
        self._drawn.text(self.query_one(".chart-title", Static), model.title)
        self._drawn.text(self.query_one(".axis-top", Static), Text(model.top))
        self._drawn.text(self.query_one(".axis-bottom", Static), Text(model.bottom))
        self.query_one(Spark).data = model.data


class OverviewPanel(TableWidth, Vertical):
    DEFAULT_CSS = """
    OverviewPanel { height: 1fr; }
    OverviewPanel #health { height: 1; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    OverviewPanel #ranks { height: auto; max-height: 60%; }
    OverviewPanel #parts-legend { height: auto; max-height: 4; margin: 0 1; }
    OverviewPanel #alert { height: auto; max-height: 3; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    OverviewPanel #table-caption { height: 1; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    OverviewPanel #heat-strip { height: auto; margin: 0 1; }
    OverviewPanel #standouts { height: auto; max-height: 2; margin: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    FIXED_LINES = 1 + 1 + 1 + 2 + 2 + 4 * 3 + 3
    """A large run's lines besides its table rows and heat strip: health, caption, table header,
    standouts, the window legend and the run's step parts, four charts at their least, the alert."""

    def __init__(self) -> None:
        super().__init__(id="overview-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield HangBanner()
        yield Static(id="health")
        yield Static(id="table-caption")
        table = FastTable(id="ranks", cursor_type="none", zebra_stripes=True)
        table.can_focus = False  # the app's keys move through a large run's rows (only those on screen exist)
        yield table
        yield Static(id="parts-legend")
        yield Static(id="heat-strip")
        yield Static(id="standouts")
        yield Chart("step")
        yield Chart("loss")
        yield Chart("grad-norm")
        yield Chart("busbw")
        yield Static(id="alert")

    def budget(self, ranks: int, banner_lines: int) -> tuple[int, int]:
        """(table rows, heat-strip lines) for a large run, so that the charts and the alert stay on
        screen at any rank count: the strip gets up to a third of what is spare (its legend aside),
        the rows the rest up to 40 % of the panel (the charts what is left), at least 3 rows."""
        spare = max(0, self.content_size.height - self.FIXED_LINES - banner_lines)
        width = max(10, self.table_width)
        strip = max(1, min(-(-ranks // width), (spare - 1) // 3, 8))
        return max(3, min(spare - strip - 1, int(self.content_size.height * 0.4) - 1)), strip

    def show(self, model: OverviewModel) -> None:
        d = self._drawn
        self.query_one(HangBanner).show(model.banner)
        d.text(self.query_one("#health", Static), model.health)
        for key, text in (("#table-caption", model.caption), ("#heat-strip", model.strip),
                          ("#standouts", model.standouts)):
            d.optional_text(self.query_one(key, Static), text)
        table = self.query_one("#ranks", DataTable)
        d.table(table, model.columns, model.rows)
        d.cursor(table, model.cursor)
        legend = self.query_one("#parts-legend", Static)
        legend.display = bool(model.legend.plain)
        d.text(legend, model.legend)
        for chart, chart_model in zip(self.query(Chart), model.charts):
            chart.show(chart_model)
        d.text(self.query_one("#alert", Static), model.alert)
