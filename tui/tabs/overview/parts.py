"""Where the run's step went, live: the mean of its ranks' `window_parts` (tui/state/step_parts.py),
as `summary`'s `run` line is the mean of its ranks'."""

from __future__ import annotations

from ringtop.metrics import step_waterfall as wf
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.step_parts import window_parts
from ringtop.tui.state.view_model import RunView

__all__ = ["run_parts", "window_parts"]


def _run_rows(view: RunView) -> list[RankRow]:
    timed = [r for r in view.ranks.values() if r.comm_history]
    return [r for r in timed if not r.ended] or timed


def run_parts(view: RunView) -> dict[str, float]:
    """The run's step, where it went: the mean of its ranks' `window_parts` (live ranks; all once
    every one has ended), as `summary`'s `run` line is the mean of its ranks'."""
    pipeline = view.facts.strategy == "pp"
    return wf.mean_parts(window_parts(r, pipeline) for r in _run_rows(view))
