"""The Pipeline tab's model: what its widget draws, made by its panel from the run's state (immutable, so
a widget redraws only what changed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

from ringtop.tui.tables import Column


@dataclass(frozen=True)
class PipelineModel:
    caption: Text
    timeline: Text
    detail: bool
    """Whether a pipeline step was seen: the parts below the timeline are shown only then."""
    legend: Text = field(default_factory=Text)
    bubble: Text = field(default_factory=Text)
    stage_columns: tuple[Column, ...] = ()
    stage_rows: tuple = ()
    history_caption: Text = field(default_factory=Text)
    history_columns: tuple[Column, ...] = ()
    history_rows: tuple = ()
