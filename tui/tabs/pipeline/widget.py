"""The Pipeline tab: the last step's stage timeline, its bubble against theory, per stage, history."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from ringtop.tui.tabs.pipeline.model import PipelineModel
from ringtop.tui.widgets.drawing import Drawn
from ringtop.tui.widgets.fast_table import FastTable

DETAIL_IDS = ("#pp-legend", "#pp-bubble", "#pp-stages", "#pp-history-caption", "#pp-history")


class PipelinePanel(VerticalScroll):
    DEFAULT_CSS = """
    PipelinePanel { height: 1fr; }
    PipelinePanel .caption { height: auto; margin: 0 1; }
    PipelinePanel #pp-timeline { height: auto; margin: 1 1 0 1; text-wrap: nowrap; }
    PipelinePanel #pp-legend { height: 1; margin: 0 1; }
    PipelinePanel #pp-bubble { height: auto; margin: 1 1 0 1; }
    PipelinePanel #pp-stages { height: auto; margin: 1 0 0 0; }
    PipelinePanel #pp-history-caption { height: auto; margin: 1 1 0 1; }
    PipelinePanel #pp-history { height: auto; }
    """

    def __init__(self) -> None:
        super().__init__(id="pipeline-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="pp-caption", classes="caption")
        yield Static(id="pp-timeline")
        yield Static(id="pp-legend")
        yield Static(id="pp-bubble")
        yield FastTable(id="pp-stages", cursor_type="none", zebra_stripes=True)
        yield Static(id="pp-history-caption")
        yield FastTable(id="pp-history", cursor_type="none", zebra_stripes=True)

    @property
    def timeline_width(self) -> int:
        return self.query_one("#pp-timeline", Static).content_size.width

    def show(self, model: PipelineModel) -> None:
        d = self._drawn
        d.text(self.query_one("#pp-caption", Static), model.caption)
        d.text(self.query_one("#pp-timeline", Static), model.timeline)
        for selector in DETAIL_IDS:
            self.query_one(selector).display = model.detail
        if not model.detail:
            return
        d.text(self.query_one("#pp-legend", Static), model.legend)
        d.text(self.query_one("#pp-bubble", Static), model.bubble)
        d.table(self.query_one("#pp-stages", DataTable), model.stage_columns, model.stage_rows)
        d.text(self.query_one("#pp-history-caption", Static), model.history_caption)
        d.table(self.query_one("#pp-history", DataTable), model.history_columns, model.history_rows)
