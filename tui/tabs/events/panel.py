"""The Events tab's panel: the run's state in, `EventsModel` out; event lines rebuilt only when
the events held changed."""

from __future__ import annotations

from ringtop.tui.panel import Built, Frame
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.events.model import EventsModel
from ringtop.tui.tabs.events.render import event_line, operations_text
from ringtop.tui.tabs.events.widget import EventsPanel


class EventsTab:
    tab = "events"
    widget = EventsPanel

    def __init__(self) -> None:
        self._events_key: tuple | None = None
        self._event_lines: tuple = ()

    def build(self, frame: Frame, widget: EventsPanel) -> Built:
        return Built(self.model(frame.view, replay=frame.replay))

    def model(self, view: RunView, *, replay: bool) -> EventsModel:
        key = (view.events_total, len(view.events))
        if key != self._events_key:
            self._events_key = key
            held = sorted(view.events, key=lambda e: (e.ts, e.seq))
            self._event_lines = tuple((e.seq, event_line(e)) for e in held)
        first = min((seq for seq, _ in self._event_lines), default=view.events_total)
        return EventsModel(operations_text(view, replay=replay), self._event_lines, not_kept=first)
