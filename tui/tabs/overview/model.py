"""The Overview's model: what its widget draws, made by its panel from the run's state (immutable, so
a widget redraws only what changed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

from ringtop.tui.tables import Column


@dataclass(frozen=True)
class ChartModel:
    """One chart: its series (one point per step, oldest first) and the words around it."""

    title: Text
    data: tuple[float, ...]
    top: str = ""
    """The y-axis label at the top (the series' max) and at the bottom (its min), with the unit."""
    bottom: str = ""


@dataclass(frozen=True)
class OverviewModel:
    health: Text
    columns: tuple[Column, ...]
    rows: tuple
    legend: Text
    charts: tuple[ChartModel, ...]
    alert: Text
    banner: Text = field(default_factory=Text)
    """Who holds the others up (tui/tabs/hang/render.py); empty hides the banner."""
    caption: Text = field(default_factory=Text)
    """Above a windowed table (a large run, a filter, a sort): where, in what order, which rows."""
    strip: Text = field(default_factory=Text)
    """A large run's heat strip, one cell per rank, its legend first; empty hides it."""
    standouts: Text = field(default_factory=Text)
    """A large run's slowest ranks and robust outliers; empty hides them."""
    cursor: int | None = None
    """The row (of `rows`) the cursor is on; None: no cursor (a small run's table)."""
    cursor_key: str | None = None
    """That row's key (`n<host>` for a node row): what Enter opens."""
