"""The hang banner (top of the Overview, shown only while ranks are stuck) and the Hang view: the
verdict, one row per rank (or set of ranks alike), the selected rank's stack, the latest stacks reply."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from ringtop.tui.tabs.hang.model import HangModel
from ringtop.tui.widgets.drawing import Drawn, TableWidth, text_signature
from ringtop.tui.widgets.fast_table import FastTable


class HangBanner(Static):
    """Hidden while its text is empty: nothing is stuck."""

    DEFAULT_CSS = """
    HangBanner { height: auto; max-height: 4; margin: 0 1; padding: 0 1 0 0; background: $error 15%;
                 border-left: thick $error; display: none; }
    """

    def __init__(self) -> None:
        super().__init__(id="hang-banner")
        self._shown: tuple | None = None

    def show(self, text: Text) -> None:
        sig = text_signature(text)
        if sig != self._shown:
            self._shown = sig
            self.update(text)
            self.display = bool(text.plain)


class HangPanel(TableWidth, VerticalScroll):
    DEFAULT_CSS = """
    HangPanel { height: 1fr; }
    HangPanel #hang-caption { height: auto; margin: 0 1; }
    HangPanel #hang-ranks { height: auto; max-height: 50%; margin: 1 0 0 0; }
    HangPanel #hang-stack { height: auto; margin: 1 1 0 1; }
    HangPanel #hang-reply { height: auto; margin: 1 1 0 1; padding: 0 1; border-left: thick $accent; }
    """

    def __init__(self) -> None:
        super().__init__(id="hang-body")
        self._drawn = Drawn()

    def compose(self) -> ComposeResult:
        yield Static(id="hang-caption")
        yield FastTable(id="hang-ranks", cursor_type="row", zebra_stripes=True)
        yield Static(id="hang-stack")
        yield Static(id="hang-reply")

    def show(self, model: HangModel) -> None:
        d = self._drawn
        d.text(self.query_one("#hang-caption", Static), model.caption)
        table = self.query_one("#hang-ranks", DataTable)
        table.display = bool(model.rows)
        d.table(table, model.columns, model.rows)
        stack = self.query_one("#hang-stack", Static)
        stack.display = bool(model.stack.plain)
        d.text(stack, model.stack)
        reply = self.query_one("#hang-reply", Static)
        reply.display = bool(model.reply.plain)
        d.text(reply, model.reply)
