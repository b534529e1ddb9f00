"""The Events tab's model: what its widget draws, made by its panel from the run's state (immutable, so
a widget redraws only what changed)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text


@dataclass(frozen=True)
class EventsModel:
    operations: Text
    lines: tuple[tuple[int, Text], ...]
    """(seq, line) of the events still held, in time order."""
    not_kept: int = 0
    """Older events the view no longer holds."""
