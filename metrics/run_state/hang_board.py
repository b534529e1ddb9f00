"""Where stuck ranks are, as every surface holds it (the UI, the Prometheus exporter, `summary`):
each rank's latest `stall` report, its latest stacks snapshot, and rank 0's latest `hang` and
`desync` events. Messages duck-typed, as the rest of metrics/run_state.

The reading itself (who holds the others up) is `metrics.hang.diagnose`, run on these reports by
`rules.hang_reading`, so a surface names the culprit even when rank 0 is among the stuck. Step
digests are not compared here: rank 0's relay sees every `step` a UI can see (the UI subscribes
through it, and may drop some), so its `desync` event is the one reading of them.
"""

from __future__ import annotations

from typing import Any

from ringtop.metrics.rules.hang import STARTING, HangVerdict

Event = Stall = Any  # protocol structs, read by their fields

HANG_EVENT_KINDS = ("hang", "desync")
NOTICE_S = 60.0
"""A `desync` event (or a `hang` event the UI has no reports for) is shown this long after it was
sent, by the run's own clock (the newest `ts` the UI has seen): a replay shows it the same way."""


class HangBoard:
    def __init__(self) -> None:
        self.stalled: dict[int, Stall] = {}
        """Per rank, its latest `stalled` (or, in start-up, `starting`) report, until it recovers (a
        `recovered`, a later `step`, its `bye`)."""
        self.snapshots: dict[int, Stall] = {}
        """Per rank, its latest answer to a `stacks` command (this UI's or another client's: every
        rank publishes its answer on telemetry)."""
        self.snapshot_request = ""
        """The `stacks` command the latest snapshot answered."""
        self.hang_event: Event | None = None
        """Rank 0's latest `hang` event (its own reading; `cleared` when every rank steps again)."""
        self.desync_event: Event | None = None
        self._order = 0
        self._arrived: dict[tuple[str, int], int] = {}
        """(stalled | snapshot, rank) -> the order it arrived in: the newer one's stack is shown."""
        self._hang_event_order = 0
        self._cleared_order = 0
        """When the UI last saw a stall end: a `hang` event older than that is not restated."""

    # ------------------------------------------------------------------ input

    def on_stall(self, msg: Stall) -> None:
        self._order += 1
        if msg.state in ("stalled", STARTING):
            self.stalled[msg.rank] = msg
            self._arrived[("stalled", msg.rank)] = self._order
        elif msg.state == "snapshot":
            self.snapshots[msg.rank] = msg
            self.snapshot_request = msg.request or self.snapshot_request
            self._arrived[("snapshot", msg.rank)] = self._order
        else:
            self._clear(msg.rank)

    def on_step(self, rank: int, step: int) -> bool:
        """True when this step ends the rank's stall (the step it was stuck in is done)."""
        report = self.stalled.get(rank)
        if report is None or step < report.step:
            return False
        self._clear(rank)
        return True

    def on_bye(self, rank: int) -> None:
        self._clear(rank)

    def on_event(self, msg: Event) -> bool:
        """Rank 0's hang and desync events; True when it was one."""
        if msg.kind not in HANG_EVENT_KINDS:
            return False
        self._order += 1
        if msg.kind == "hang":
            self.hang_event = msg
            self._hang_event_order = self._order
        else:
            self.desync_event = msg
        return True

    def _clear(self, rank: int) -> None:
        if self.stalled.pop(rank, None) is not None:
            self._order += 1
            self._cleared_order = self._order

    # ------------------------------------------------------------------ output

    def report_of(self, rank: int) -> tuple[str, Stall] | None:
        """("stalled" | "snapshot", the report) with the newer stack of the rank, if any."""
        stalled, snapshot = self.stalled.get(rank), self.snapshots.get(rank)
        if stalled is not None and (snapshot is None or self._arrived[("stalled", rank)]
                                    >= self._arrived[("snapshot", rank)]):
            return "stalled", stalled
        return ("snapshot", snapshot) if snapshot is not None else None

    def rank0_verdict(self, latest_ts: float, ended: bool) -> HangVerdict | None:
        """Rank 0's own reading, for a UI that holds no stall report (it attached after they were
        sent, or lost them): only while no stall has ended since, and not past NOTICE_S."""
        e = self.hang_event
        if e is None or ended or self.stalled or self._hang_event_order < self._cleared_order:
            return None
        report = e.hang
        if report is None or report.verdict == "cleared" or latest_ts - e.ts > NOTICE_S:
            return None
        return HangVerdict(report.verdict, e.text, culprits=tuple(sorted(set(report.culprits))),
                           waiting=tuple(sorted(set(report.waiting))), group=report.group, seq=report.seq,
                           collective=report.collective, wait_s=report.wait_s, step=report.step,
                           where=dict(report.where))

    def reported_stalled(self) -> list[int]:
        """Ranks whose standing report says `stalled` (not `starting`: start-up is not a stall yet)."""
        return sorted(rank for rank, s in self.stalled.items() if s.state == "stalled")

    def rank0_culprits(self) -> frozenset[int]:
        """The ranks rank 0's latest `hang` event holds the others up for; empty once it is cleared."""
        report = self.hang_event.hang if self.hang_event is not None else None
        if report is None or report.verdict == "cleared":
            return frozenset()
        return frozenset(report.culprits)

    def desync_notice(self, latest_ts: float, ended: bool) -> Event | None:
        """Rank 0's latest `desync` event while the run goes on, for NOTICE_S."""
        e = self.desync_event
        if e is None or ended or latest_ts - e.ts > NOTICE_S:
            return None
        return e

