"""The Memory tab's model: what its widget draws, made by its panel from the run's state (immutable, so
a widget redraws only what changed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

from ringtop.tui.tables import Column


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
