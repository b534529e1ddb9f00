"""The run's cross-rank readings: the rows in order, the slowest rank, the run's throughput and
MFU, the charts' series, the drops, who holds the others up. Mixed into `RunView`."""

from __future__ import annotations

import math

from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.rules.hang import HangVerdict
from ringtop.metrics.rules.outliers import SLOWEST_SHOWN, Outlier, slowest
from ringtop.metrics.run_state.rules import hang_reading
from ringtop.protocol import Event
from ringtop.tui.state.rank_row import RankRow


class RunReadings:
    """Mixed into `RunView`: derived from its rows and parts, never stored."""

    def rows(self) -> list[RankRow]:
        self._ensure_slowest()
        return [self.ranks[r] for r in sorted(self.ranks)]
    @property
    def slowest(self) -> Outlier | None:
        """The one slowest rank every screen shows (the Overview's ▲, its health and alert lines,
        the Comm tab): the most compute per step (`RankRow.window_compute_ms`, the step less its
        waits, over its last SLOWEST_WINDOW timed steps) against the others' median, by
        metrics.rules.outliers.slowest, as the agent's straggler rule picks it. Among the live
        ranks; once every rank has ended, among all. None with fewer than two such ranks. Shown
        from `SLOWEST_SHOWN` above the others."""
        self._ensure_slowest()
        return self._slowest
    @property
    def slowest_rank(self) -> int | None:
        found = self.slowest
        return None if found is None else found.rank
    @property
    def slowest_excess_pct(self) -> float:
        """How much more compute the slowest rank spends than the others' median, in percent."""
        found = self.slowest
        return math.nan if found is None else found.excess_pct
    @property
    def slowest_shown(self) -> Outlier | None:
        """`slowest` when it is far enough above the others to be marked and named (SLOWEST_SHOWN)."""
        found = self.slowest
        return found if found is not None and found.meets(SLOWEST_SHOWN) else None
    def live_rows(self) -> list[RankRow]:
        return [r for r in self.rows() if not r.ended]
    @property
    def latest_step(self) -> int:
        """The step every live rank has reached (min over live ranks); -1 when unknown."""
        rows = [r for r in self.live_rows() if r.step >= 0] or [r for r in self.rows() if r.step >= 0]
        return min((r.step for r in rows), default=-1)
    @property
    def tokens_per_s(self) -> float:
        rows = self.live_rows() or self.rows()
        return sum(r.tokens_per_s for r in rows)
    @property
    def tflops(self) -> float:
        """The run's achieved TFLOP/s: its ranks' latest steps summed."""
        rows = self.live_rows() or self.rows()
        return sum(r.tflops for r in rows)
    @property
    def mfu(self) -> float | None:
        """The run's MFU: its TFLOP/s over its ranks' summed peaks; None (n/a) unless every rank
        that reports TFLOP/s has a known peak."""
        rows = [r for r in (self.live_rows() or self.rows()) if r.tflops > 0]
        if not rows or any(r.peak_tflops <= 0 for r in rows):
            return None
        return mfu(sum(r.tflops for r in rows), sum(r.peak_tflops for r in rows))
    @property
    def step_ms_max_history(self) -> list[float]:
        return [p.max_ms for p in self.step_history.points]
    @property
    def step_ms_median_history(self) -> list[float]:
        return [p.median_ms for p in self.step_history.points]
    @property
    def grad_norm_history(self) -> list[float]:
        return [p.grad_norm for p in self.step_history.points if math.isfinite(p.grad_norm)]
    @property
    def nonfinite_ranks(self) -> list[int]:
        """Live ranks whose latest loss (from a step this UI received) is not finite."""
        return sorted(r.rank for r in self.ranks.values()
                      if r.step_seen is not None and not r.ended and not math.isfinite(r.loss))
    @property
    def loss_history(self) -> list[float]:
        return [p.loss for p in self.step_history.points if math.isfinite(p.loss)]
    @property
    def total_drops(self) -> int:
        """Messages that did not reach the UI; with digests, a lost digest counts once."""
        return sum(r.drops for r in self.ranks.values()) + self.relay_gaps + self.digests_lost
    @property
    def stale_skipped(self) -> int:
        """Readings left out to stay current (each for a newer one of the same rank): by rank 0's
        relay while it was behind, and by this UI's receiver while the UI was."""
        return self.relay_skipped + self.receiver_skipped

    @property
    def wants_digests(self) -> bool:
        return self.facts.world_size >= self.digest_min_ranks
    def _update_slowest(self) -> None:
        timed = [r for r in self.ranks.values() if r.comm_history]
        candidates = [r for r in timed if not r.ended] or timed
        for r in self.ranks.values():
            r.slowest = False
        found = slowest({r.rank: r.window_compute_ms for r in candidates})
        self._slowest = found
        if found is not None:
            self.ranks[found.rank].slowest = True
    def hang_verdict(self) -> HangVerdict | None:
        """Who holds the others up, and where: the UI's own reading of the stall reports it holds
        (`metrics.hang.diagnose`, recomputed only when a report, a death or a bye moved the `hang`
        version on); without reports, rank 0's latest `hang` event while it stands. None when
        nothing is stuck."""
        version = self.versions["hang"]
        if self._hang_reading[0] != version:
            self._hang_reading = (version, self._diagnose())
        own = self._hang_reading[1]
        return own if own is not None else self.hang.rank0_verdict(self.latest_ts, self.is_ended)
    def _diagnose(self) -> HangVerdict | None:
        return hang_reading(self.hang, self.ranks, self.facts.world_size)  # as the exporter and summary read it
    def desync_notice(self) -> Event | None:
        """Rank 0's latest `desync` event (its comparison of the steps' collectives), while the
        run goes on and for NOTICE_S after it."""
        return self.hang.desync_notice(self.latest_ts, self.is_ended)
