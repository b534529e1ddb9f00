"""One rank as the UI holds it: the state every surface folds (metrics/run_state/rank.py), its
liveness, its histories, and (mixed in from tui/state/readings.py) what the screens derive from them."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ringtop.metrics.run_state.rank import RankState
from ringtop.protocol import Prediction
from ringtop.tui.state.readings import CommReadings, MemoryReadings, StepReadings

HISTORY_POINTS = 240
"""Points kept per chart history (per rank and cross-rank)."""


class RunningStat:
    """Running time-weighted mean, min, max and last of a metric, without storing history.

    Each value is weighted by the time it covers: the gap since the previous sample's timestamp,
    or, for the first sample (or a non-increasing timestamp), `fallback_weight` — for step times
    the step's own duration in seconds, so both weights are in seconds.
    """

    __slots__ = ("count", "min", "max", "last", "_wsum", "_w", "_last_ts")

    def __init__(self) -> None:
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.last = math.nan
        self._wsum = 0.0
        self._w = 0.0
        self._last_ts: float | None = None

    def update(self, value: float, ts: float | None = None, fallback_weight: float = 1.0) -> None:
        if not math.isfinite(value):
            return
        weight = fallback_weight
        if ts is not None:
            last = self._last_ts
            if last is None:
                self._last_ts = ts
            elif ts > last:
                weight = ts - last
                self._last_ts = ts
        if not 0.0 < weight < math.inf:
            weight = 1.0
        self.count += 1
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        self.last = value
        self._wsum += value * weight
        self._w += weight

    @property
    def mean(self) -> float:
        return self._wsum / self._w if self._w > 0 else math.nan


@dataclass(frozen=True)
class NonFinite:
    step: int
    rank: int


@dataclass(slots=True)
class RankRow(StepReadings, MemoryReadings, CommReadings, RankState):
    """The rank's state every surface folds (metrics/run_state/rank.py: its latest step, how it
    ended, the run's totals) and what only the screens keep of it."""

    local_rank: int = 0
    device: str = ""
    tflops_ceiling: float = 0.0
    """From the rank's Hello: the most TFLOP/s it could do (metrics/rules/peaks.py); above it a figure is
    implausible. 0 = not known."""
    tflops_ceiling_source: str = ""
    mem_rss_bytes: int = 0
    """From the latest Step or Sample that carried one."""
    device_mem_total_bytes: int = 0
    prediction: Prediction | None = None
    """The cost model's figures for this rank, from its Hello (None when the agent sent none)."""
    # host / device samples
    cpu_percent: float = math.nan
    gpu_util_percent: float = math.nan
    gpu_mem_used_bytes: int = 0
    # loss of messages
    seq_lost: int = 0
    """Messages missing from this rank's `seq` since the UI started following it (lost anywhere
    between the rank's `emit` and this UI: agent queue, sockets, relay)."""
    # liveness
    last_seen: float | None = None
    """`now` of the last message received from this rank (caller's clock)."""
    last_ts: float = 0.0
    """The agent's wall-clock `ts` of its last message."""
    silent_s: float = 0.0
    heard_since: float | None = None
    """`now` of the first message this UI got from it (a UI attached to a hung run saw no step)."""
    process_started_ts: float = 0.0
    """Its Hello's: a look at its process from outside checks the pid is still that process."""
    stuck_seen: float | None = None
    """`now` of the latest look that found it stuck (`RankState.stuck`, tui/sources/exit_probe.py)."""
    slowest: bool = False
    version: int = 0
    """Moves on with every message folded into this row (and when it is found dead): a screen
    rebuilds a rank's cells only when it moved, or when what they are compared with did."""
    recent_cache: tuple[int, float] = field(default=(-1, math.nan), repr=False, compare=False)
    """(version, recent_step_ms()) as last computed."""
    idle_cache: tuple[int, float] = field(default=(-1, math.nan), repr=False, compare=False)
    """(version, window_idle_pct) as last computed."""
    compute_cache: tuple[int, float] = field(default=(-1, math.nan), repr=False, compare=False)
    """(version, window_compute_ms) as last computed."""
    parts_cache: object = field(default=None, repr=False, compare=False)
    """Its steps split into their parts over the window (tui/tabs/overview/parts.py WindowParts)."""
    # history and running stats
    step_ms_stat: RunningStat = field(default_factory=RunningStat)
    step_ms_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    loss_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    comm_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    """This rank's timed steps (`reducers.comm.TimedStep`), oldest first (for the Comm tab's window
    and chart); `reducers.comm.rank_step` makes a CommStep of one when a window reads it."""
