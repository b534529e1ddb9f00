"""The Comm tab: per collective kind, the chart of bus bandwidth, exposed time, per rank, verdicts."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from ..tables import Column
from .drawing import Drawn, TableWidth
from .spark import Spark


@dataclass(frozen=True)
class CommModel:
    caption: Text
    kinds_columns: tuple[Column, ...]
    kinds_rows: tuple
    chart_label: Text
    chart: tuple[float, ...]
    exposed: Text
    ranks_columns: tuple[Column, ...]
    ranks_rows: tuple
    verdicts: Text


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
    CommPanel #verdicts { height: auto; margin: 1 1 0 1; padding: 0 1; border-left: thick $warning; }
    """

    def __init__(self) -> None:
        super().__init__(id="comm-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="comm-caption", classes="caption")
        yield DataTable(id="comm-kinds", cursor_type="none", zebra_stripes=True)
        with Horizontal(classes="comm-chart"):
            yield Static(id="comm-chart-label")
            yield Spark(id="comm-spark")
        yield Static(id="comm-exposed")
        yield DataTable(id="comm-ranks", cursor_type="none", zebra_stripes=True)
        yield Static(id="verdicts")

    def show(self, model: CommModel) -> None:
        d = self._drawn
        d.text(self.query_one("#comm-caption", Static), model.caption)
        d.table(self.query_one("#comm-kinds", DataTable), model.kinds_columns, model.kinds_rows)
        d.text(self.query_one("#comm-chart-label", Static), model.chart_label)
        self.query_one("#comm-spark", Spark).data = model.chart
        d.text(self.query_one("#comm-exposed", Static), model.exposed)
        d.table(self.query_one("#comm-ranks", DataTable), model.ranks_columns, model.ranks_rows)
        d.text(self.query_one("#verdicts", Static), model.verdicts)
