"""What a rank's row derives from its latest step and its recent window, by concern: the step's
own figures (idle, throughput, the windowed step time), its memory, its communication. Mixed into
`RankRow` (tui/state/rank_row.py), read when a screen reads them, not at every message: at 1024
ranks x 10 Hz the fold runs 10k times a second, a repaint reads the rows it shows 4 times. The
definitions (idle time, a share of the step) are metrics/timing.py's."""

from __future__ import annotations

import math
from itertools import islice

from ringtop.metrics.run_state.rank import RankState
from ringtop.metrics.timing import STEP_WINDOW, compute_ms, share_pct
from ringtop.metrics.timing import idle_ms as step_idle_ms
from ringtop.tui.state.reducers.comm import step_times

SLOWEST_WINDOW = STEP_WINDOW
"""Recent steps per rank: its step-time cell's mean, its idle %, and the compute the slowest rank
is picked on (metrics.timing.STEP_WINDOW)."""


class StepReadings:
    """The latest step's own figures and the window the step-time cell uses."""

    __slots__ = ()

    @property
    def drops(self) -> int:
        """Messages of this rank that did not reach the UI.

        The agent stamps `seq` when a message is emitted, before its queue, so a message the agent
        drops shows up both in its `drops` counter and as a gap here; adding the two would count it
        twice. Gaps cover every loss since the UI started following the rank, the agent's counter
        also covers the time before; the larger of the two is the best single figure.
        """
        return max(self.agent_drops, self.seq_lost)
    @property
    def grad_norm(self) -> float:
        """Step.grad_norm of the latest step: global, before clipping; NaN when not finite or not sent."""
        g = None if self.latest is None else self.latest.grad_norm
        return math.nan if g is None else g
    @property
    def tokens_per_s(self) -> float:
        return 0.0 if self.latest is None else self.latest.tokens_per_s
    @property
    def tflops(self) -> float:
        """Step.tflops of the latest step: 0 when the agent does not know its model's FLOPs."""
        t = 0.0 if self.latest is None else self.latest.tflops
        return t if 0.0 < t < math.inf else 0.0
    @property
    def idle_reported(self) -> bool:
        """Whether the latest step carried Step.idle_ms (> 0); False: idle % is data + exposed comm.
        Step.idle_ms defaults to 0: an agent that does not send it (older) reads as 0, and a rank
        never waits exactly 0 ms, so 0 means "not sent"."""
        return self.latest is not None and 0.0 < self.latest.idle_ms < math.inf
    @property
    def idle_ms(self) -> float:
        """Step.idle_ms of the latest step (0 when the agent does not send it)."""
        return self.latest.idle_ms if self.idle_reported else 0.0
    @property
    def idle_pct(self) -> float:
        """The latest step's idle time (metrics.timing.idle_ms) as a percentage of it."""
        reported = self.latest.idle_ms if self.latest is not None else 0.0
        return share_pct(step_idle_ms(self.data_ms, self.exposed_comm_ms, reported), self.step_ms)
    @property
    def window_step_ms(self) -> float:
        """The step time the screens show for this rank and pick the slowest rank on: the mean of its
        last SLOWEST_WINDOW steps (metrics.timing.STEP_WINDOW)."""
        return self.recent_step_ms()
    @property
    def window_idle_pct(self) -> float:
        """Idle % over the window the step-time cell uses (the last STEP_WINDOW timed steps: their
        idle time, metrics.timing.idle_ms, over their step time), as the Comm tab's window gives it;
        the latest step's before any step was timed."""
        if self.idle_cache[0] == self.version:
            return self.idle_cache[1]
        pts = list(islice(reversed(self.comm_history), SLOWEST_WINDOW))
        step = sum(s.step_ms for s in pts)
        value = share_pct(sum(s.idle_ms for s in pts), step) if pts else self.idle_pct
        self.idle_cache = (self.version, value)
        return value
    @property
    def window_compute_ms(self) -> float:
        """Compute per step over the window (metrics.timing.compute_ms of the last SLOWEST_WINDOW
        timed steps' mean step, exposed comm and input): what the slowest rank is picked on, on
        every screen (the Overview's ▲, the Comm tab, as the agent's straggler rule). NaN before a
        timed step."""
        if self.compute_cache[0] == self.version:
            return self.compute_cache[1]
        pts = list(islice(reversed(self.comm_history), SLOWEST_WINDOW))
        step = data = exposed = 0.0
        for s in reversed(pts):  # oldest first, as the Comm tab's window sums them
            d, e, _ = step_times(s)
            step, data, exposed = step + s.step_ms, data + d, exposed + e
        value = compute_ms(step / len(pts), exposed / len(pts), data / len(pts)) if pts else math.nan
        self.compute_cache = (self.version, value)
        return value
    def recent_step_ms(self, window: int = SLOWEST_WINDOW) -> float:
        """The mean of the last `window` step times (`RankState.recent_step_ms`, as the exporter and
        `summary` read it); the default window's kept until the row moves on (the repaint asks several
        times per rank)."""
        if window == SLOWEST_WINDOW and self.recent_cache[0] == self.version:
            return self.recent_cache[1]
        mean = RankState.recent_step_ms(self, window)  # the rule every surface reads
        if window == SLOWEST_WINDOW:
            self.recent_cache = (self.version, mean)
        return mean


class MemoryReadings:
    """What the rank holds: its state by the agent's count, the rest measured."""

    __slots__ = ()

    @property
    def mem_params_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.params_bytes
    @property
    def mem_grads_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.grads_bytes
    @property
    def mem_optimizer_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.optimizer_bytes
    @property
    def mem_cuda_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.cuda_allocated_bytes
    @property
    def mem_cuda_reserved_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.cuda_reserved_bytes
    @property
    def mem_cuda_peak_bytes(self) -> int:
        return 0 if self.latest is None else self.latest.mem.cuda_peak_bytes
    @property
    def mem_bytes(self) -> int:
        """The memory figure for the table: CUDA allocated when on a GPU, else process RSS."""
        return self.mem_cuda_bytes if self.mem_cuda_bytes > 0 else self.mem_rss_bytes
    @property
    def mem_is_cuda(self) -> bool:
        return self.mem_cuda_bytes > 0
    @property
    def mem_state_bytes(self) -> int:
        """Parameters + gradients + optimizer state this rank holds (counted by the agent)."""
        return self.mem_params_bytes + self.mem_grads_bytes + self.mem_optimizer_bytes
    @property
    def mem_other_bytes(self) -> int:
        """Everything else: CUDA allocated − state on a GPU, process RSS − state on CPU; never < 0."""
        return max(0, self.mem_bytes - self.mem_state_bytes) if self.mem_bytes else 0
    @property
    def mem_peak_other_bytes(self) -> int:
        """Like mem_other_bytes, from the CUDA peak when there is one (the high-water mark a
        strategy must leave room for)."""
        if self.mem_is_cuda:
            return max(0, max(self.mem_cuda_peak_bytes, self.mem_cuda_bytes) - self.mem_state_bytes)
        return self.mem_other_bytes


class CommReadings:
    """The latest step's collectives: bytes, rates, the exposed share."""

    __slots__ = ()

    @property
    def comm(self) -> list:
        """The latest step's CommStats (the message's own list)."""
        return [] if self.latest is None else self.latest.comm
    @property
    def comm_busy_ms(self) -> float:
        """Wall time with a collective in flight in the latest step (Step.comm_busy_ms)."""
        return 0.0 if self.latest is None else self.latest.comm_busy_ms
    @property
    def comm_bytes(self) -> int:
        """Sum of CommStat.bytes in the latest step."""
        return sum(c.bytes for c in self.comm)
    @property
    def comm_kind_bytes(self) -> dict[str, int]:
        """Per collective kind, payload bytes in the latest step."""
        kinds: dict[str, int] = {}
        for c in self.comm:
            kinds[c.kind] = kinds.get(c.kind, 0) + c.bytes
        return kinds
    @property
    def comm_mb_s(self) -> float:
        """comm_bytes / step time, in MB/s (1 MB = 1e6 bytes); NaN without a step time."""
        return self.comm_bytes / (self.step_ms / 1000.0) / 1e6 if self.step_ms > 0 else math.nan
    @property
    def comm_kind_mb_s(self) -> dict[str, float]:
        """Per collective kind, bytes in the latest step / step time, in MB/s (sums to comm_mb_s)."""
        if not self.step_ms > 0:
            return dict.fromkeys(self.comm_kind_bytes, math.nan)
        step_s = self.step_ms / 1000.0
        return {k: b / step_s / 1e6 for k, b in self.comm_kind_bytes.items()}
    @property
    def comm_share_pct(self) -> float:
        """exposed_comm_ms / step_ms, in percent."""
        return share_pct(self.exposed_comm_ms, self.step_ms)
