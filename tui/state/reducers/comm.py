"""Communication per step summed over the ranks that reported it (the Comm tab's window and
chart), and the collective kinds the run uses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from ringtop.metrics.timing import STEP_WINDOW, finite_or_0, idle_ms
from ringtop.protocol import CommStat, Step

COMM_KIND_ORDER = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
"""Collective kinds in the order the screens list them; other kinds follow alphabetically."""


@dataclass(slots=True)
class CommStep:
    """Communication of one step: one rank's (`RankRow.comm_history`), or summed over the ranks that
    reported that step number (`CommLedger.steps`). Sums, so windows add them up; `ranks` counts
    the rank-steps summed, the divisor for per-step means."""

    step: int
    ranks: int = 0
    step_ms: float = 0.0
    data_ms: float = 0.0
    exposed_comm_ms: float = 0.0
    """Exposed communication (Step.exposed_comm_ms)."""
    busy_ms: float = 0.0
    """Union of in-flight collective intervals (Step.comm_busy_ms)."""
    idle_ms: float = 0.0
    """Idle time (metrics.timing.idle_ms: Step.idle_ms, or input + exposed communication)."""
    kinds: dict[tuple[str, int, str], CommStat] = field(default_factory=dict)
    """(kind, group size, mesh dimension) -> the kind's totals there, summed; busy_ms per kind adds
    each call's own time."""

    def add(self, other: "CommStep") -> None:
        self.ranks += other.ranks
        self.step_ms += other.step_ms
        self.data_ms += other.data_ms
        self.exposed_comm_ms += other.exposed_comm_ms
        self.busy_ms += other.busy_ms
        self.idle_ms += other.idle_ms
        kinds = self.kinds
        for key, c in other.kinds.items():
            acc = kinds.get(key)
            if acc is None:
                acc = kinds[key] = CommStat(kind=c.kind, group_size=c.group_size, group=c.group)
            acc.add(c)

    def add_timed(self, msg: Step | TimedStep, idle: float) -> None:
        """One rank's timed step into these sums (`idle`: its idle time, `step_idle`): the one way a
        step is summed, for the ledger's steps and a rank's window alike."""
        data, blocked, busy = step_times(msg)
        self.ranks += 1
        self.step_ms += msg.step_ms
        self.data_ms += data
        self.exposed_comm_ms += blocked
        self.busy_ms += busy
        self.idle_ms += idle
        kinds = self.kinds
        for c in msg.comm:
            key = (c.kind, c.group_size, c.group)
            acc = kinds.get(key)
            if acc is None:
                acc = kinds[key] = CommStat(kind=c.kind, group_size=c.group_size, group=c.group)
            acc.add(c)



COMM_WINDOW = STEP_WINDOW
"""Steps in the Comm tab's window (per rank; aggregated: these step numbers over all ranks): the
window the ranks table's step ms and slowest marker use too."""


class TimedStep(msgspec.Struct, frozen=True, gc=False):
    """What a rank's history (`RankRow.comm_history`) keeps of a timed Step: its communication
    fields, named as in Step, and the message's own CommStats. Whole Steps would hold 2.3x the
    memory (1024 ranks x 260 steps: 230 MB held by the view, 76 MB with these, 141 with the
    CommSteps made per message before)."""

    step: int
    step_ms: float
    data_ms: float
    exposed_comm_ms: float
    comm_busy_ms: float
    comm: tuple[CommStat, ...]
    """A tuple of the message's CommStats (gc=False structs): the collector stops tracking it, so
    a thousand ranks' histories add nothing to the garbage collector's passes (a list stays
    tracked: 65k of them made its full passes take hundreds of ms at 1024 ranks)."""
    idle_ms: float = 0.0
    """The step's idle time, resolved once (`step_idle`: Step.idle_ms, or input + exposed comm)."""
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    tflops: float = 0.0
    """The phases and TFLOP/s, for where the step went over the window (metrics/step_waterfall.py:
    the Overview's bars and run line)."""


def timed(msg: Step) -> bool:
    """A step with a measured time (finite, > 0): only those count in the communication windows."""
    return 0.0 < msg.step_ms < math.inf


def step_times(msg: Step | TimedStep) -> tuple[float, float, float]:
    """(data_ms, exposed_comm_ms, comm_busy_ms) of a step as the windows sum them: a time that is
    not finite counts as none (`finite_or_0`)."""
    data, blocked, busy = msg.data_ms, msg.exposed_comm_ms, msg.comm_busy_ms
    return (data if type(data) is float and data - data == 0.0 else finite_or_0(data),
            blocked if type(blocked) is float and blocked - blocked == 0.0 else finite_or_0(blocked),
            busy if type(busy) is float and busy - busy == 0.0 else finite_or_0(busy))


def step_idle(msg: Step | TimedStep) -> float:
    """A step's idle time as every screen reads it (metrics.timing.idle_ms)."""
    data, exposed, _ = step_times(msg)
    return idle_ms(data, exposed, finite_or_0(msg.idle_ms))


def rank_step(msg: Step | TimedStep) -> CommStep:
    """One rank's CommStep from its timed step, built only when a window or chart of that rank is
    read."""
    cs = CommStep(step=msg.step)
    cs.add_timed(msg, step_idle(msg))
    return cs


class CommLedger:
    def __init__(self, points: int) -> None:
        self.steps: dict[int, CommStep] = {}
        """Per step number, communication summed over the ranks that reported it (bounded)."""
        self.kinds_seen: set[str] = set()
        self._points = points

    @property
    def kinds(self) -> list[str]:
        """The run's collective kinds, the common ones first in COMM_KIND_ORDER."""
        known = [k for k in COMM_KIND_ORDER if k in self.kinds_seen]
        return known + sorted(self.kinds_seen.difference(COMM_KIND_ORDER))

    def collect(self, msg: Step) -> TimedStep | None:
        """Fold one rank's step into its step number's sums; returns what the rank's history keeps
        of it (None for a step without time: no part of any window, `timed`)."""
        comm = msg.comm
        seen = self.kinds_seen
        if not timed(msg):
            for c in comm:
                seen.add(c.kind)
            return None
        own = TimedStep(msg.step, msg.step_ms, msg.data_ms, msg.exposed_comm_ms, msg.comm_busy_ms, tuple(comm),
                        step_idle(msg), msg.forward_ms, msg.backward_ms, msg.optimizer_ms, msg.tflops)
        steps = self.steps
        agg = steps.get(msg.step)
        if agg is None:
            if len(steps) >= self._points:
                oldest = min(steps)
                if msg.step < oldest:
                    seen.update(c.kind for c in comm)
                    return own  # older than everything kept
                del steps[oldest]
            agg = steps[msg.step] = CommStep(step=msg.step)
        agg.add_timed(msg, own.idle_ms)
        seen.update(c.kind for c in comm)
        return own

    def clear(self) -> None:
        """A new strategy: the window and chart start again, in other collectives."""
        self.steps.clear()
        self.kinds_seen.clear()
