"""The Memory tab: what each rank holds (state by the agent's count, the rest measured), and
which strategy would fit, from the one cost model."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from ..tables import Column
from .drawing import Drawn, TableWidth


@dataclass(frozen=True)
class MemoryModel:
    caption: Text
    columns: tuple[Column, ...]
    rows: tuple
    fit_caption: Text
    fit_columns: tuple[Column, ...]
    fit_rows: tuple


class MemoryPanel(TableWidth, VerticalScroll):
    DEFAULT_CSS = """
    MemoryPanel { height: 1fr; }
    MemoryPanel .caption { height: auto; margin: 0 1; }
    MemoryPanel #fit-caption { margin: 1 1 0 1; }
    MemoryPanel #mem-ranks { height: auto; max-height: 60%; }
    MemoryPanel #fit { height: auto; }
    """

    def __init__(self) -> None:
        super().__init__(id="memory-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="mem-caption", classes="caption")
        yield DataTable(id="mem-ranks", cursor_type="none", zebra_stripes=True)
        yield Static(id="fit-caption", classes="caption")
        yield DataTable(id="fit", cursor_type="none")

    def show(self, model: MemoryModel) -> None:
        d = self._drawn
        d.text(self.query_one("#mem-caption", Static), model.caption)
        d.table(self.query_one("#mem-ranks", DataTable), model.columns, model.rows)
        d.text(self.query_one("#fit-caption", Static), model.fit_caption)
        d.table(self.query_one("#fit", DataTable), model.fit_columns, model.fit_rows)
