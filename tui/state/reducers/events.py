"""The event log: every event line the UI shows, bounded, numbered in arrival order."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from ringtop.tui.sanitize import visible

MAX_EVENTS = 500


@dataclass(frozen=True)
class EventLine:
    seq: int
    """Position in the run's event stream, counting from 0; lets a screen append only new lines."""
    ts: float
    """Wall-clock seconds."""
    level: str
    rank: int | None
    text: str
    kind: str = ""
    cmd_id: str = ""


class EventLog:
    """The newest `max_events` lines, and the latest warning (not a verdict's: those have their
    own line) for the Overview's alert."""

    def __init__(self, max_events: int = MAX_EVENTS, quiet_kinds: frozenset[str] = frozenset()) -> None:
        self.lines: deque[EventLine] = deque(maxlen=max_events)
        self.total = 0
        self.last_warning: EventLine | None = None
        self._quiet_kinds = quiet_kinds

    def add(self, level: str, rank: int | None, text: str, ts: float, *, kind: str = "", cmd_id: str = "") -> None:
        line = EventLine(seq=self.total, ts=ts or time.time(), level=level, rank=rank, text=visible(text),
                         kind=visible(kind), cmd_id=visible(cmd_id))
        self.total += 1
        self.lines.append(line)
        if level in ("warn", "error") and kind not in self._quiet_kinds:
            self.last_warning = line

    def since(self, seq: int) -> list[EventLine]:
        """Event lines with `seq >= seq` still held (older ones may have been dropped)."""
        if not self.lines or self.lines[-1].seq < seq:
            return []
        return [e for e in self.lines if e.seq >= seq]
