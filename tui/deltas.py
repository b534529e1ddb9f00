"""Measured beside predicted: how far apart, as a number and as a table cell (the Memory and Comm
tabs' delta columns say it the same way)."""

from __future__ import annotations

import math

from rich.text import Text

from ringtop.metrics import fmt


def pct_diff(measured: float, predicted: float) -> float:
    """(measured - predicted) / predicted in percent; 0 when both are 0, nan when only predicted is 0."""
    if predicted == 0:
        return 0.0 if measured == 0 else math.nan
    return 100.0 * (measured - predicted) / predicted


def delta_text(measured: float, predicted: float) -> Text:
    """How far the measurement is from the prediction: `=` when equal to the byte, else a percentage."""
    if measured == predicted:
        return Text("=", style="green")
    d = pct_diff(measured, predicted)
    if not math.isfinite(d):
        return Text("new", style="yellow")
    return Text(fmt.delta_pct(d), style="green" if abs(d) < 1 else ("yellow" if abs(d) < 10 else "bold red"))
