"""The header's model: what its widget draws, made by its panel from the run's state (immutable, so
a widget redraws only what changed)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text


@dataclass(frozen=True)
class HeaderModel:
    facts: Text
    connection: Text
