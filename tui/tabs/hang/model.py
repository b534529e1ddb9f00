"""The Hang view's model: what its widget draws, made by its panel from the run's state (immutable, so
a widget redraws only what changed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

from ringtop.tui.tables import Column


@dataclass(frozen=True)
class HangModel:
    caption: Text
    columns: tuple[Column, ...]
    rows: tuple
    """(key, cells) per row; empty hides the table (nothing stuck, no snapshot)."""
    stack: Text
    reply: Text = field(default_factory=Text)
