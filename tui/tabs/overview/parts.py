"""Where the step went, live: each rank's mean over its last STEP_WINDOW timed steps (the window its
step ms, idle % and the slowest rank's compute are over) and the run's mean of those, by
metrics/step_waterfall.py, the parts and words `summary`, `report` and `diff` use.

A rank's parts are kept per step and only the steps that arrived since the last reading are split
(`step_waterfall.step_parts` costs a few µs: a window of every rank again at each repaint would be
most of a 1024-rank UI's time)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from ringtop.metrics import step_waterfall as wf
from ringtop.metrics.costs.flops import mfu
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.readings import SLOWEST_WINDOW
from ringtop.tui.state.view_model import RunView


@dataclass(slots=True)
class WindowParts:
    """One rank's split steps (RankRow.parts_cache): (step, parts in wf.PARTS order), newest last."""

    key: tuple
    """(pipeline, device peak): what the split depends on besides the step."""
    steps: deque = field(default_factory=lambda: deque(maxlen=SLOWEST_WINDOW))
    version: int = -1
    mean: dict[str, float] = field(default_factory=dict)


def split_step(s, pipeline: bool, peak_tflops: float) -> tuple[float, ...]:
    """One timed step (reducers.comm.TimedStep) as its parts, in wf.PARTS order (0 for a part it lacks)."""
    ratio = mfu(s.tflops, peak_tflops) if peak_tflops > 0 and 0 < s.tflops < float("inf") else None
    parts = wf.step_parts(s.step_ms, s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms, s.exposed_comm_ms,
                          s.idle_ms, pipeline, ratio)
    return tuple(parts.get(name, 0.0) for name in wf.PARTS)


def window_parts(row: RankRow, pipeline: bool = False) -> dict[str, float]:
    """The rank's step over its last SLOWEST_WINDOW timed steps, where it went: each part's mean (ms),
    the parts it had (> 0), in wf.PARTS order; they add up to its mean step. Empty before a timed step."""
    key = (pipeline, row.peak_tflops)
    held = row.parts_cache
    if not isinstance(held, WindowParts) or held.key != key:
        held = row.parts_cache = WindowParts(key)
    if held.version == row.version:
        return held.mean
    history = row.comm_history
    newest = held.steps[-1][0] if held.steps else None
    if not history or (newest is not None and history[-1].step < newest):
        held.steps.clear()  # a new strategy or a restarted rank: its history began again
        newest = None
    fresh = []
    for s in islice(reversed(history), SLOWEST_WINDOW):
        if newest is not None and s.step <= newest:
            break
        fresh.append(s)
    for s in reversed(fresh):
        held.steps.append((s.step, split_step(s, pipeline, row.peak_tflops)))
    n = len(held.steps)
    sums = [sum(col) for col in zip(*(p for _, p in held.steps))] if n else []
    held.mean = {name: total / n for name, total in zip(wf.PARTS, sums) if total > 0}
    held.version = row.version
    return held.mean


def run_parts(view: RunView) -> dict[str, float]:
    """The run's step, where it went: the mean of its ranks' `window_parts` (live ranks; all once
    every one has ended), as `summary`'s `run` line is the mean of its ranks'."""
    timed = [r for r in view.ranks.values() if r.comm_history]
    rows = [r for r in timed if not r.ended] or timed
    pipeline = view.facts.strategy == "pp"
    return wf.mean_parts(window_parts(r, pipeline) for r in rows)
