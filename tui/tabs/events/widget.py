"""The Events tab: the latest operations and where each stands, then every event in time order."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from ringtop.tui.tabs.events.model import EventsModel
from ringtop.tui.widgets.drawing import Drawn


class EventsPanel(Vertical):
    """A RichLog wraps a line at the width it had when the line was written, so the log is written
    only while shown and written again whenever its width changes or an event arrives out of order."""

    DEFAULT_CSS = """
    EventsPanel { height: 1fr; }
    EventsPanel #ops { height: auto; max-height: 8; margin: 0 1; border-bottom: solid $panel-lighten-2;
                       text-wrap: nowrap; text-overflow: ellipsis; }
    EventsPanel #event-log { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__(id="events-body")
        self._drawn = Drawn()
        self._written: list[int] = []
        self._width = 0

    def compose(self) -> ComposeResult:
        yield Static(id="ops")
        yield RichLog(id="event-log", max_lines=2000, wrap=True, markup=False, auto_scroll=True, min_width=20)

    def show(self, model: EventsModel) -> None:
        self._drawn.text(self.query_one("#ops", Static), model.operations)
        log = self.query_one("#event-log", RichLog)
        width = log.scrollable_content_region.width
        if width <= 0:
            return  # not laid out yet: the next repaint writes
        seqs = [seq for seq, _ in model.lines]
        appended = width == self._width and seqs[: len(self._written)] == self._written
        if appended and len(seqs) == len(self._written):
            return
        if not appended:
            log.clear()
            self._written = []
            if model.not_kept:
                log.write(Text(f"… {model.not_kept:,} older events not kept", style="dim"), width=width)
        for _, line in model.lines[len(self._written):]:
            log.write(line, width=width)  # not the console's width, which a headless run leaves at 80
        self._written = seqs
        self._width = width
