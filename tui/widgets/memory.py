"""The Memory tab: what each rank holds (state by the agent's count, the rest measured), and
which strategy would fit, from the one cost model."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from ..tables import Column
from .drawing import Drawn, TableWidth
from .fast_table import FastTable


@dataclass(frozen=True)
class MemoryModel:
    caption: Text
    columns: tuple[Column, ...]
    rows: tuple
    fit_caption: Text
    fit_columns: tuple[Column, ...]
    fit_rows: tuple
    table_caption: Text = field(default_factory=Text)
    """A large run's: where (nodes, a node's ranks, a filter), in what order, which rows; empty hides it."""
    standouts: Text = field(default_factory=Text)
    """A large run's ranks holding most and the robust outliers; empty hides them."""
    cursor: int | None = None
    """The row (of `rows`) the cursor is on; None: no cursor (a small run's table)."""
    cursor_key: str | None = None
    """That row's key (`n<host>` for a node row): what Enter opens."""


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
