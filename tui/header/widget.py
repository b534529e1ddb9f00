"""The one-line header: what the run is (left) and whether the UI hears it (right)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from ringtop.tui.header.model import HeaderModel
from ringtop.tui.widgets.drawing import Drawn


class RunHeader(Horizontal):
    DEFAULT_CSS = """
    RunHeader { height: 1; background: $panel; }
    RunHeader #facts { width: 1fr; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    RunHeader #conn { width: auto; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__(id="header")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="facts")
        yield Static(id="conn")

    def show(self, model: HeaderModel) -> None:
        self._drawn.text(self.query_one("#facts", Static), model.facts)
        self._drawn.text(self.query_one("#conn", Static), model.connection)
