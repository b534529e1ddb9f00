"""Where a step's time goes, from the per-step numbers every rank reports (Step): one definition
for the agent's diagnosis, the Comm tab, the ranks table, the end-of-run summary and Prometheus.

The numbers, each defined here once (all in milliseconds of one optimizer step on one rank):

- step time (`step_ms`): host wall time from the start of a step (fetching its batch) to the end of
  its optimizer step, as the rank's step clock (agent/instruments/step_clock.py) measures it. A
  screen that shows one number per rank shows the mean over the rank's last `STEP_WINDOW` steps;
  the slowest rank is picked on that same mean, and the rank's idle % is over the same steps
  (their idle time over their step time).
- exposed communication (`exposed_comm_ms`): the time the training thread waited on collectives
  (blocked, not overlapped with compute); at most the time collectives were in flight
  (`comm_busy_ms`). The same name in the protocol, logs, UI and Prometheus
  (`ringtop_exposed_comm_seconds_total`); older logs' `comm_blocked_ms` is read as it.
- idle (`idle_ms`, shown as idle % of the step): the time the rank waited rather than computed:
  input (`data_ms`) plus exposed communication, or in a pipeline input plus the stage's measured
  bubble (its exposed waits are the bubble). The agent sends it (Step.idle_ms); a step that lacks
  it (older agents) reads as input + exposed communication (`idle_ms`).
- compute (`compute_ms`): the step minus exposed communication and input.
"""

from __future__ import annotations

import math
from collections import deque


def compute_ms(step_ms: float, exposed_comm_ms: float, data_ms: float) -> float:
    """step - exposed communication - data loading, never < 0: the time the rank spent computing.

    Ranks in lockstep have equal step times (every collective waits for the last to arrive), so
    this, not the step time, tells the slow rank. NaN without a measured step (step_ms not > 0).
    """
    if not step_ms > 0:
        return math.nan
    return max(0.0, step_ms - exposed_comm_ms - data_ms)


STEP_WINDOW = 20
"""Steps per rank in the one window the screens show a rank's step time over (the ranks table's
cell, its slowest marker, the Comm tab, `ctl status`): long enough that one noisy step does not
move a marker."""


class StepWindow:
    """A rank's last STEP_WINDOW step times and their mean, as the screens show one step time per
    rank (the UI's cell): `ctl status` reads rank 0's from another thread, so each step replaces
    one tuple (its step, the mean, how many steps it is over)."""

    __slots__ = ("_times", "latest")

    def __init__(self, size: int = STEP_WINDOW) -> None:
        self._times: deque[float] = deque(maxlen=size)
        self.latest: tuple[int, float, int] = (-1, math.nan, 0)

    def add(self, step: int, step_ms: float) -> None:
        """One step's time; one that is not finite is no time (the UI's cell leaves it out too)."""
        if isinstance(step_ms, (int, float)) and math.isfinite(step_ms):
            self._times.append(step_ms)
        n = len(self._times)
        self.latest = (step, sum(self._times) / n if n else math.nan, n)


def status_step_ms(window: StepWindow) -> dict[str, float | int | None]:
    """`status`'s step-time fields (plain values, for scripts): the window's mean, how many steps it
    is over and the newest of them; `ringtop ctl` prints them as the UI does (fmt.ms)."""
    step, mean, n = window.latest
    return {"step_ms": mean if math.isfinite(mean) else None, "step_ms_steps": n, "step_ms_last_step": step}


def step_idle_ms(data_ms: float, exposed_comm_ms: float, bubble_idle_ms: float | None = None) -> float:
    """What the agent sends as Step.idle_ms: input plus exposed communication, or in a pipeline
    (`bubble_idle_ms` measured from its timeline) input plus the stage's bubble."""
    return finite_or_0(data_ms) + finite_or_0(exposed_comm_ms if bubble_idle_ms is None else bubble_idle_ms)


def idle_ms(data_ms: float, exposed_comm_ms: float, reported_idle_ms: float = 0.0) -> float:
    """A step's idle time as every screen reads it: Step.idle_ms when the agent sent it (> 0, finite),
    else input plus exposed communication (an agent that does not send it: `step_idle_ms`)."""
    if 0.0 < reported_idle_ms < math.inf:
        return reported_idle_ms
    return step_idle_ms(data_ms, exposed_comm_ms)


def share_pct(part_ms: float, step_ms: float) -> float:
    """`part_ms` as a percentage of the step (exposed comm %, idle %); NaN without a step."""
    return 100.0 * part_ms / step_ms if step_ms > 0 else math.nan


def overlap_pct(busy_ms: float, exposed_comm_ms: float) -> float:
    """The share of communication hidden behind compute: 1 - exposed / busy, clamped to 0..100.

    NaN when nothing was in flight (busy_ms not > 0) or the exposed time is unknown.
    """
    if not busy_ms > 0 or not math.isfinite(exposed_comm_ms):
        return math.nan
    return min(100.0, max(0.0, 100.0 * (1.0 - exposed_comm_ms / busy_ms)))


def finite_or_0(x: float) -> float:
    """A time from a message, NaN or missing taken as none at all."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else 0.0
