"""The messages a rank sends, folded into its row: Hello (the run's facts too), Step and the relay's
digests and recent steps, Sample, Heartbeat, Event, Timeline, Stall, Bye. Mixed into `RunView`;
`ROUTES` (tui/state/view_model.py) names the handler of each message type."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any

from ringtop.metrics.run_lifecycle import stop_source
from ringtop.metrics.run_state.rules import start_attempt
from ringtop.protocol import (
    UI_RANK,
    Bye,
    Digest,
    Event,
    Heartbeat,
    Hello,
    RecentSteps,
    Sample,
    Stall,
    Step,
    StepBrief,
    Timeline,
)
from ringtop.tui.state.rank_row import NonFinite, RankRow
from ringtop.tui.state.reducers import VERDICT_KINDS
from ringtop.tui.state.reducers.comm import COMM_WINDOW
from ringtop.tui.state.reducers.steps import spike_of_event
from ringtop.tui.state.step_parts import take_new_steps
from ringtop.tui.words import words

COMM_HISTORY_BUDGET = 64 * 1024
"""Timed steps kept over all ranks' communication histories (about 500 bytes each, ~32 MB): a
rank keeps HISTORY_POINTS of them up to 273 ranks, then its share (64 at 1024 ranks), never fewer
than the Comm tab's window. 240 for each of 1024 ranks held 125 MB, and the UI's memory rose
for the 48 s they took to fill."""
MAX_RANKS_BEFORE_HELLO = 1024
"""Rows the view makes for ranks it has no Hello for yet (a Hello from rank 0 gives the real count)."""


class _BriefSender:
    """A brief as `_sender` reads a message: its rank, `seq` (none: 0) and `ts`."""

    __slots__ = ("rank", "seq", "ts")

    def __init__(self, brief: StepBrief) -> None:
        self.rank, self.seq, self.ts = brief.rank, 0, brief.ts


class RankFold:
    """Mixed into `RunView`: one handler per message type, `now` the caller's clock."""

    def _on_hello(self, msg: Hello, now: float) -> None:
        if msg.rank == UI_RANK:
            return
        if msg.rank >= msg.world_size:
            self.note_rejected(f"hello from rank {msg.rank} of a world of {msg.world_size}", now)
            return
        if self.facts.run_id and msg.run_id and msg.run_id != self.facts.run_id:
            old = self.facts.run_id
            self._reset()
            self.event_log.add("info", None, f"new run {msg.run_id} (was {old})", msg.ts, kind="run")
        self._last_rx = now
        if msg.restart_count > self.restart.count:
            self._run_restarted(msg)
        elif msg.restart_cause and msg.restart_count == self.restart.count and not self.restart.cause:
            self.restart = replace(self.restart, cause=msg.restart_cause)  # rank 0 read it in the logs
        if msg.rank == 0 or not self.facts.run_id:  # rank 0's Hello, or the first heard
            self._take_facts(msg)
        row = self._row(msg.rank)
        first, restarted = self._rejoin(row, msg)
        row.take_hello(msg)
        row.version += 1
        if row.heard_since is None:
            row.heard_since = now
        row.process_started_ts = msg.process_started_ts
        row.local_rank = msg.local_rank
        row.device = msg.device or row.device
        row.prediction = msg.prediction
        row.tflops_ceiling, row.tflops_ceiling_source = msg.tflops_ceiling, msg.tflops_ceiling_source
        peak = getattr(msg, "link_peak_gbps", 0.0)  # hook: a Hello that states the link's peak
        if peak:
            self._agent_link_peak(peak, f"rank {msg.rank}")
        if msg.device_mem_total_bytes:
            row.device_mem_total_bytes = msg.device_mem_total_bytes
        row.last_seen = now
        row.last_ts = max(row.last_ts, msg.ts)
        if first or restarted:  # an agent may repeat its Hello for late joiners; say it once
            where = f"{msg.host} pid {msg.pid}" if msg.host else f"pid {msg.pid}"
            extra = f", resuming at step {msg.start_step}" if msg.start_step else ""
            self.event_log.add("info", msg.rank,
                            f"{'rejoined' if restarted else 'joined'}: {where}, {msg.strategy or '?'} on "
                            f"{msg.device or msg.backend or '?'}{extra}", msg.ts, kind="hello")

    def _run_restarted(self, msg: Hello) -> None:
        """The first Hello of a new attempt (its launcher started every rank again): what ended the
        last one is kept, then every rank's end is forgotten, as each of them starts again
        (metrics/run_state/rules.py, as the exporter and `summary` keep it)."""
        self.restart = start_attempt(self.ranks.values(), self.lifecycle(), msg)
        for row in self.ranks.values():
            row.stuck_seen = None
            self._live.add(row.rank)
        self.step_history.restart()
        self._end_reported = False
        said = f"the run restarted (restart {msg.restart_count}) {self.restart.after}"
        self.event_log.add("warn", None, said.rstrip(), msg.ts, kind="restart")

    def _take_facts(self, msg: Hello) -> None:
        """The run's facts from an authoritative Hello, and what they change: rows beyond the world,
        the histories' length, the collectives of a new strategy, the links."""
        f = self.facts
        old = f.take(msg)
        self._drop_phantom_rows()
        if f.world_size != old.world_size:
            self._bound_comm_histories()
        if (f.strategy, f.strategy_options) != (old.strategy, old.strategy_options):
            self.comm_ledger.clear()  # a new strategy talks in other collectives
            for r in self.ranks.values():
                r.comm_history.clear()
        if f.link_peaks_by_group != old.link_peak_gbps_by_group:
            self.versions["comm"] += 1

    def _rejoin(self, row: RankRow, msg: Hello) -> tuple[bool, bool]:
        """(first Hello of the rank, a restart of it): a restarted rank starts its counts again."""
        first, restarted = row.rejoin(msg)  # a cached Hello sent again is no restart (RankState.rejoin)
        if restarted:
            self._live.add(row.rank)
            row.seq_lost = 0
        if not (first or restarted):
            self._track_seq(row, msg)  # a Hello repeated in-stream; an old cached copy is ignored
        return first, restarted

    def _on_step(self, row: RankRow, msg: Step, now: float) -> None:
        folded = msg.step <= row.folded_step  # it came direct and in a digest, or first in RecentSteps' brief
        if folded and self.via_digests:
            row.step_seen = now
            return
        row.take_step(msg, now)  # the latest figures, as every surface takes them (metrics/run_state)
        rss = msg.mem.rss_bytes
        if rss:
            row.mem_rss_bytes = rss
        if msg.cpu_percent:
            row.cpu_percent = msg.cpu_percent
        own = self.comm_ledger.collect(msg)
        if own is not None:
            row.comm_history.append(own)
            take_new_steps(row, self.facts.strategy == "pp")  # split once, here, not at every repaint
        if not folded:
            row.count_step(msg)
            self._fold_step(row, msg.step, msg.ts, msg.step_ms, row.loss, msg.grad_norm, msg.skipped)
    def _fold_step(self, row: RankRow, step: int, ts: float, step_ms: float, loss: float,
                   grad_norm: float | None, skipped: bool) -> None:
        """What every step adds, whole or a digest's brief of it: the rank's histories, the
        cross-rank chart, the skipped and non-finite counts."""
        if self.hang.stalled and self.hang.on_step(row.rank, step):
            self.versions["hang"] += 1
        row.fold_step(step, step_ms)
        if math.isfinite(step_ms):
            row.step_ms_stat.update(step_ms, ts or None, (step_ms if step_ms > 0.0 else 0.0) / 1000.0)
        row.loss_history.append(loss)
        if grad_norm is None:
            grad_norm = math.nan
        if skipped and (self.last_skipped_step is None or step > self.last_skipped_step):
            self.last_skipped_step = step  # every rank skips the same step: count it once
            self.skipped_steps += 1
        if not math.isfinite(loss):
            first = self.first_nonfinite
            if first is None or (step, row.rank) < (first.step, first.rank):
                self.first_nonfinite = NonFinite(step=step, rank=row.rank)
        self.step_history.collect(step, row.rank, step_ms, loss, self._live, grad_norm)
        self._slowest_dirty = True
    def _on_digest(self, msg: Digest, now: float) -> None:
        """The relay's conflated steps (agent/transport/step_digest.py): each rank's older steps by their
        numbers, then its latest whole, as if they had come one by one."""
        if self._digest_seq and msg.seq > self._digest_seq + 1:
            self.digests_lost += msg.seq - self._digest_seq - 1
        if msg.seq > self._digest_seq:
            self._digest_seq = msg.seq
        self.via_digests = True
        self.digests_folded += 1
        self.relay_gaps = max(self.relay_gaps, msg.relay_gaps)
        self.relay_skipped = max(self.relay_skipped, msg.relay_skipped)
        self.briefs_dropped += msg.briefs_dropped
        rows: dict[int, RankRow] = {}
        for step in msg.steps:
            row = self._sender(step, now)
            if row is not None:
                rows[step.rank] = row
        goodput = self.goodput
        for b in msg.briefs:
            row = rows.get(b.rank)
            if row is None:
                row = rows[b.rank] = self._sender(_BriefSender(b), now)  # a step too big to carry whole
                if row is None:
                    continue
            if b.step > row.folded_step:
                self._fold_step(row, b.step, b.ts, b.step_ms, math.nan if b.loss is None else b.loss,
                                b.grad_norm, b.skipped)
                goodput.add_step(b.rank, b.ts, b.step_ms, b.skipped, b.step)
        for step in msg.steps:
            row = rows.get(step.rank)
            if row is not None:
                if step.step > row.folded_step:
                    goodput.add(step)
                self._on_step(row, step, now)
    def _on_recent_steps(self, msg: RecentSteps, now: float) -> None:
        """The relay's last steps of each rank, for a UI attaching mid-run: the charts and the rows'
        step numbers start from them. Only steps a rank's row has not folded yet (a UI already
        attached gets them too), only of ranks whose Hello came; not news of a rank being alive.
        Goodput takes each too: it counts none twice (a step that ends before the last one counted
        adds nothing), and a UI that kept its count across a restart has missed the new attempt's
        first steps otherwise."""
        goodput = self.goodput
        for b in msg.briefs:
            goodput.add_step(b.rank, b.ts, b.step_ms, b.skipped, b.step)
            row = self.ranks.get(b.rank)
            if row is not None and b.step > row.folded_step:
                self._fold_step(row, b.step, b.ts, b.step_ms, math.nan if b.loss is None else b.loss,
                                b.grad_norm, b.skipped)
                if row.latest is None:  # no whole step yet: the row shows the latest brief's
                    row.loss = math.nan if b.loss is None else b.loss
                    row.step_ms = b.step_ms
    def _on_bye(self, row: RankRow, msg: Bye, now: float) -> None:
        was_ended = self.is_ended
        if not row.take_bye(msg, row.last_seen):
            return  # the relay's cached copy, sent again to a new subscriber
        self._live.discard(row.rank)
        self.hang.on_bye(row.rank)
        level = "info" if msg.ok or stop_source(msg.reason) else "error"  # a user's stop is no error
        self.event_log.add(level, msg.rank, f"bye at step {msg.step}: {row.bye_reason}", msg.ts, kind="bye")
        self._slowest_dirty = True
        self.step_history.close_complete(self._live)
        if self.is_ended and not was_ended:
            self._say_the_end(msg.ts)
    def _on_sample(self, row: RankRow, msg: Sample, now: float) -> None:
        if msg.cpu_percent or not math.isfinite(row.cpu_percent):
            row.cpu_percent = msg.cpu_percent
        if msg.rss_bytes:
            row.mem_rss_bytes = msg.rss_bytes
        if msg.gpu is not None:
            row.gpu_util_percent = msg.gpu.util_percent
            row.gpu_mem_used_bytes = msg.gpu.mem_used_bytes
            if msg.gpu.mem_total_bytes:
                row.device_mem_total_bytes = msg.gpu.mem_total_bytes
    def _on_heartbeat(self, row: RankRow, msg: Heartbeat, now: float) -> None:
        row.take_heartbeat(msg)
    def _on_event(self, row: RankRow | None, msg: Event, now: float) -> None:
        if self.hang.on_event(msg):
            self.versions["hang"] += 1
        if msg.kind in VERDICT_KINDS:
            peak = self.verdict_board.on_event(msg)
            if peak is not None:
                self._agent_link_peak(peak, "the agent (--link)")
        if msg.kind == "loss_spike":
            spike = spike_of_event(msg)
            if spike is not None:
                self.step_history.last_spike = spike
        if msg.kind == "operations_recent":
            data = msg.data if isinstance(msg.data, dict) else {}
            self.command_log.restated(data.get("operations"), msg.ts)
            return  # restated for late joiners, not news
        if msg.kind != "verdicts_active":  # a periodic restatement for late joiners, not news
            rank = msg.rank if msg.rank != UI_RANK else None
            self.event_log.add(msg.level, rank, self._event_text(msg), msg.ts, kind=msg.kind)
    def _on_timeline(self, row: RankRow, msg: Timeline, now: float) -> None:
        self.pipeline.add(msg, host=row.host)
    def _on_stall(self, row: RankRow, msg: Stall, now: float) -> None:
        self.hang.on_stall(msg)
    @staticmethod
    def _event_text(msg: Event) -> str:
        text = msg.text or msg.kind or "(empty event)"
        kind = words(msg.kind)
        if msg.kind and msg.text and not msg.text.startswith((msg.kind, kind)):
            text = f"{kind}: {msg.text}"
        elif not msg.text:
            text = kind or "(empty event)"
        if msg.step >= 0:
            text = f"{text} (step {msg.step})"
        return text
    def _track_seq(self, row: RankRow, msg: Any) -> None:
        seq = msg.seq
        if row.last_seq is not None and seq > row.last_seq + 1 and not self.via_digests:
            row.seq_lost += seq - row.last_seq - 1
        if row.last_seq is None or seq > row.last_seq:
            row.last_seq = seq
    def _row(self, rank: int) -> RankRow:
        row = self.ranks.get(rank)
        if row is None:
            row = RankRow(rank=rank, device_mem_total_bytes=self.facts.device_mem_total_bytes)
            row.step_ms_history = deque(maxlen=self.history_points)
            row.loss_history = deque(maxlen=self.history_points)
            row.comm_history = deque(maxlen=self.comm_points())
            self.ranks[rank] = row
            self._live.add(rank)
        return row
    def _may_add_row(self, rank: int) -> bool:
        """A row only for a rank of the run: below the world size its Hello gave, and before any
        Hello at most MAX_RANKS_BEFORE_HELLO rows (forged ranks never make thousands)."""
        if self.facts.world_size:
            return 0 <= rank < self.facts.world_size
        return 0 <= rank and len(self.ranks) < MAX_RANKS_BEFORE_HELLO
    def _drop_phantom_rows(self) -> None:
        """Rows made before the world size was known, for ranks the run does not have."""
        for rank in [r for r in self.ranks if r >= self.facts.world_size > 0]:
            del self.ranks[rank]
            self._live.discard(rank)
            self.step_history.forget_rank(rank)
            self._slowest_dirty = True
            self.note_rejected(f"rows for rank {rank}: outside the run's {self.facts.world_size} ranks")
    def _bound_comm_histories(self) -> None:
        points = self.comm_points()
        for r in self.ranks.values():
            if r.comm_history.maxlen != points:
                r.comm_history = deque(r.comm_history, maxlen=points)
    def comm_points(self) -> int:
        """A rank's communication history's length: its share of COMM_HISTORY_BUDGET."""
        world = max(self.facts.world_size, len(self.ranks), 1)
        return max(min(COMM_WINDOW, self.history_points), min(self.history_points, COMM_HISTORY_BUDGET // world))
    def _agent_link_peak(self, gbps: float, source: str) -> None:
        if self._configured_peak[0] > 0 or not (math.isfinite(gbps) and gbps > 0):
            return  # a peak configured in the UI wins
        if (self.link_peak_gbps, self.link_peak_source) != (gbps, source):
            self.link_peak_gbps, self.link_peak_source = gbps, source
            self.versions["comm"] += 1
