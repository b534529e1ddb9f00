"""Where a rank's step went, live: its mean over its last SLOWEST_WINDOW timed steps (the window its
step ms, idle % and the slowest rank's compute are over), by metrics/step_waterfall.py, the parts
and words `summary`, `report` and `diff` use. Each step is split once, as it is folded in, and
added to the window's running sums; a reading divides (a 1024-rank repaint splitting every rank's
new steps took tens of ms)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from ringtop.metrics import step_waterfall as wf
from ringtop.metrics.costs.flops import mfu
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.readings import SLOWEST_WINDOW


@dataclass(slots=True)
class WindowParts:
    """One rank's split steps (RankRow.parts_cache): (step, parts in wf.PARTS order), newest last."""

    key: tuple
    """(pipeline, device peak): what the split depends on besides the step."""
    steps: deque = field(default_factory=lambda: deque(maxlen=SLOWEST_WINDOW))
    version: int = -1
    mean: dict[str, float] = field(default_factory=dict)
    sums: list[float] = field(default_factory=list)
    """Each part's sum over `steps`, kept as steps come and go."""
    appended: int = 0
    """Steps added to `sums` since they were last added up afresh."""


def split_step(s, pipeline: bool, peak_tflops: float) -> tuple[float, ...]:
    """One timed step (reducers.comm.TimedStep) as its parts, in wf.PARTS order (0 for a part it lacks)."""
    ratio = mfu(s.tflops, peak_tflops) if peak_tflops > 0 and 0 < s.tflops < float("inf") else None
    return wf.step_parts_row(s.step_ms, s.data_ms, s.forward_ms, s.backward_ms, s.optimizer_ms, s.exposed_comm_ms,
                             s.idle_ms, pipeline, ratio)


def window_parts(row: RankRow, pipeline: bool = False) -> dict[str, float]:
    """The rank's step over its last SLOWEST_WINDOW timed steps, where it went: each part's mean (ms),
    the parts it had (> 0), in wf.PARTS order; they add up to its mean step. Empty before a timed step."""
    held = take_new_steps(row, pipeline)
    if held.version == row.version:
        return held.mean
    n = len(held.steps)
    held.mean = {name: total / n for name, total in zip(wf.PARTS, held.sums) if total > 1e-9} if n else {}
    held.version = row.version
    return held.mean


def take_new_steps(row: RankRow, pipeline: bool) -> WindowParts:
    """The rank's steps that came since the last call, split and added to its window's sums: called
    as each step is folded in (tui/state/rank_fold.py), so a repaint of 1024 ranks only divides."""
    key = (pipeline, row.peak_tflops)
    held = row.parts_cache
    if not isinstance(held, WindowParts) or held.key != key:
        held = row.parts_cache = WindowParts(key)
    history = row.comm_history
    newest = held.steps[-1][0] if held.steps else None
    if history and newest is not None and history[-1].step == newest:
        return held  # nothing new: most calls
    if not history or (newest is not None and history[-1].step < newest):
        held.steps.clear()  # a new strategy or a restarted rank: its history began again
        newest = None
    fresh = []
    for s in islice(reversed(history), SLOWEST_WINDOW):
        if newest is not None and s.step <= newest:
            break
        fresh.append(s)
    steps, sums = held.steps, held.sums
    if not steps or held.appended >= SLOWEST_WINDOW:
        sums = None  # added up again from the window now and then: no rounding carried along
    for s in reversed(fresh):
        parts = split_step(s, pipeline, row.peak_tflops)
        if sums is not None:
            if len(steps) == steps.maxlen:
                sums = [a - b for a, b in zip(sums, steps[0][1])]
            sums = [a + b for a, b in zip(sums, parts)]
        steps.append((s.step, parts))
        held.appended += 1
    if sums is None:
        sums = [sum(col) for col in zip(*(p for _, p in steps))] if steps else []
        held.appended = 0
    if fresh or sums is not held.sums:
        held.sums = sums
        held.version = -1
    return held
