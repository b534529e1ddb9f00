"""The global step clock a process's simulated ranks publish on (the parent's and each worker's
alike): steps, heartbeats and samples when due, stall reports once hung."""

from __future__ import annotations

import abc
import math
import threading
import time

from ringtop.cli.simulate.config import SimConfig
from ringtop.cli.simulate.ranks import RankSockets
from ringtop.cli.simulate.scenario import HANG_AFTER_S, STALL_EVERY_S, STALL_THRESHOLD_S, Scenario, mean_loss
from ringtop.metrics.timing import StepWindow
from ringtop.protocol import Heartbeat


class Stepper(abc.ABC):
    """One process's share of the ranks on the clock; a subclass says when its stepping ends and
    what it does between sends (`_final_step`, `_between`, `_after_step`)."""

    def __init__(self, cfg: SimConfig, run_id: str, stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.run_id = run_id
        self.scenario = Scenario(cfg, run_id)
        self.ranks = RankSockets(cfg.ranks, self.stop)
        self.step = 0
        self.last_loss = float("nan")
        self.last_step_ms = 0.0
        self.step_window = StepWindow()
        self.hung_at: float | None = None
        self.publish_address = self.control_address = ""
        self._t0 = 0.0
        """The global step clock's start, in this process's monotonic time: step k is due at t0 + k / hz."""
        self._end = math.inf

    @property
    def sent(self) -> int:
        return self.ranks.sent

    @property
    def send_drops(self) -> int:
        return self.ranks.send_drops

    def step_ms(self, rank: int, step: int) -> float:
        return self.scenario.step_ms(rank, step)

    def _say_hello(self, started: float) -> None:
        self.ranks.send_all(lambda rank: self.scenario.hello(rank, started, self.publish_address,
                                                             self.control_address))

    @abc.abstractmethod
    def _final_step(self) -> int | None:
        """Where this process's stepping ends: None while it goes on."""

    def _after_step(self, started: float) -> None:  # noqa: B027 - a hook: nothing by default
        pass

    def _between(self) -> None:  # noqa: B027 - a hook: nothing by default
        pass

    def _publish_step(self, step: int, started: float) -> None:
        scenario, drops = self.scenario, self.ranks.drops
        self.ranks.send_all(lambda rank: scenario.step(rank, step, drops[rank]))
        self.step = step
        self.last_step_ms = self.step_ms(0, step)
        self.step_window.add(step, self.last_step_ms)
        self.last_loss = mean_loss(step)
        self._after_step(started)

    def _loop(self, started: float) -> None:
        """On the global clock (step k due at t0 + k / hz, the same in every process): slices of
        min(0.1 s, one step), each slice a tenth of the ranks sending their heartbeat and sample
        (so each rank sends them once a second, spread evenly); a step is published for every rank
        here when it is due. A process behind the clock (too many ranks for this machine)
        publishes the steps it owes late, back to back, never skipping one; --hang stops every
        process at the same step."""
        cfg = self.cfg
        period = 1.0 / cfg.hz
        slice_s = min(0.1, period)
        slices_per_s = max(1, round(1.0 / slice_s))
        t0 = self._t0
        self._end = t0 + cfg.seconds + 0.5 * period if cfg.seconds else math.inf  # the last step is due at S
        last_step = math.floor(cfg.seconds * cfg.hz + 0.5) if cfg.seconds else math.inf
        """No process steps past it, one whose parent's word comes late included."""
        hang_step = math.ceil(HANG_AFTER_S * cfg.hz - 1e-9) if cfg.hang is not None else None
        """The first step not taken: the first due HANG_AFTER_S or more after the start."""
        parts = [[r for r in self.ranks.socks if r % slices_per_s == part] for part in range(slices_per_s)]
        tick = 0
        next_stall = math.inf
        while True:
            if self.hung_at is None and hang_step is not None and self.step + 1 >= hang_step:
                self.hung_at = t0 + hang_step * period
                next_stall = self.hung_at + STALL_THRESHOLD_S
            final = self._final_step()
            if final is not None and (self.step >= min(final, last_step) or self.hung_at is not None):
                break
            done = self.hung_at is not None or self.step >= last_step
            next_step_at = math.inf if done else t0 + (self.step + 1) * period
            next_slice_at = t0 + (tick + 1) * slice_s
            now = time.monotonic()
            if final is None:
                wake = min(next_step_at, next_slice_at, next_stall, self._end)
                if wake > now:
                    self.stop.wait(wake - now)
                    continue
            self._between()
            if not done and (now >= next_step_at or final is not None):
                self._publish_step(self.step + 1, started)
            if now >= next_slice_at:
                tick = max(tick + 1, int((now - t0) / slice_s))  # heartbeats are not owed: none sent twice
                self._beat(parts[tick % slices_per_s], tick)
                if self.hung_at is not None:
                    self._after_step(started)
            if now >= next_stall:
                self._report_stalls(now - self.hung_at + period)
                next_stall += STALL_EVERY_S

    def _report_stalls(self, waited_s: float) -> None:
        self.ranks.send_all(lambda rank: self.scenario.stall(rank, self.step, waited_s))

    def _beat(self, ranks: list[int], tick: int) -> None:
        hung, drops = self.hung_at is not None, self.ranks.drops
        for rank in ranks:
            self.ranks.send(rank, Heartbeat(step=self.step, drops=drops[rank]))
            self.ranks.send(rank, self.scenario.sample(rank, tick, hung))
