"""`RunState`: the run's telemetry folded message by message, for the surfaces that are not the UI:
the Prometheus exporter (a relay observer in rank 0's process) and `summary` (the run's logs).
The UI's `RunView` makes the same fold (its rows are `RankState`s, its readings the same rules),
with what only a screen needs beside it: digests, histories, liveness, words.

`add(msg, now)`: `now` is the caller's clock (monotonic for the exporter, the messages' own `ts`
for logs): it orders the ranks' ends and times a stall report. Messages are duck-typed by their
protocol tag, as metrics/goodput.py reads them; a message of another type moves goodput's wall.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterable

from ringtop.metrics.goodput import Goodput
from ringtop.metrics.rules.hang import HangVerdict
from ringtop.metrics.run_lifecycle import Lifecycle
from ringtop.metrics.run_state.hang_board import HangBoard
from ringtop.metrics.run_state.rank import RankState
from ringtop.metrics.run_state.rules import (
    RestartSeen,
    hang_reading,
    lifecycle_of,
    restarts_left,
    run_ended,
    start_attempt,
)

MAX_RANKS_BEFORE_HELLO = 1024
"""States made for ranks before any Hello gave the world size (forged ranks never make thousands)."""


def _tag(msg: Any) -> str:
    return getattr(getattr(type(msg), "__struct_config__", None), "tag", "") or ""


class RunState:
    def __init__(self, whole_run: bool = False) -> None:
        self.whole_run = whole_run
        """Keep every step's time per rank (`summary`'s whole-run medians); a live surface does not."""
        self._reset()

    def _reset(self) -> None:
        self.run_id = ""
        self.hello: Any = None
        """Rank 0's Hello (the first heard until rank 0's comes): the run's facts."""
        self.ranks: dict[int, RankState] = {}
        self.restart = RestartSeen()
        self.restarts: list[RestartSeen] = []
        """Every restart seen, in order (`restart` is the latest)."""
        self.goodput = Goodput()
        self.hang = HangBoard()
        self.stall_seen: dict[int, float] = {}
        """Per rank, the caller's clock at its latest `stalled` report."""
        self.heard = False
        self.latest_ts = 0.0

    @property
    def world_size(self) -> int:
        return self.hello.world_size if self.hello is not None else 0

    # ------------------------------------------------------------------ input

    def add(self, msg: Any, now: float) -> None:
        tag = _tag(msg)
        if tag in ("exit", "look"):  # a node's watcher saw the rank's process gone, or alive and stuck
            of_rank = getattr(msg, "of_rank", -1)
            row = self.ranks.get(of_rank) if isinstance(of_rank, int) else None
            if tag == "exit" and row is not None:
                self.note_exit(of_rank, getattr(msg, "how", "") or "died", getattr(msg, "detail", ""), now)
            elif row is not None and not row.over:
                row.stuck = str(getattr(msg, "words", ""))
            return
        name = _HANDLERS.get(tag)
        rank = getattr(msg, "rank", -1)
        if name is not None and isinstance(rank, int) and rank >= 0:
            if name == "_on_hello":
                self._on_hello(msg, now)
            else:
                row = self._row(rank)
                if row is not None:
                    row.stuck = ""  # it speaks: no longer stuck
                    self.heard = True
                    if msg.ts > self.latest_ts:
                        self.latest_ts = msg.ts
                    if msg.seq and (row.last_seq is None or msg.seq > row.last_seq):
                        row.last_seq = msg.seq
                    getattr(self, name)(row, msg, now)
        self.goodput.add(msg)  # after the handler: a new run's Hello has reset the state

    def _row(self, rank: int) -> RankState | None:
        row = self.ranks.get(rank)
        if row is None:
            full = rank >= self.world_size if self.world_size else len(self.ranks) >= MAX_RANKS_BEFORE_HELLO
            if full:
                return None
            row = self.ranks[rank] = RankState(rank, whole_run=[] if self.whole_run else None)
        return row

    def _on_hello(self, msg: Any, now: float) -> None:
        if msg.rank >= msg.world_size:
            return
        if self.run_id and msg.run_id and msg.run_id != self.run_id:
            self._reset()
        self.heard = True
        if msg.restart_count > self.restart.count:
            self.restart = start_attempt(self.ranks.values(), self.lifecycle(), msg)
            self.restarts.append(self.restart)
        elif msg.restart_cause and msg.restart_count == self.restart.count and not self.restart.cause:
            self.restart = replace(self.restart, cause=msg.restart_cause)  # rank 0 read it in the logs
            if self.restarts:
                self.restarts[-1] = self.restart
        if msg.rank == 0 or not self.run_id:
            self.hello, self.run_id = msg, msg.run_id or self.run_id
            for rank in [r for r in self.ranks if r >= msg.world_size]:
                del self.ranks[rank]
        row = self._row(msg.rank)
        if row is not None:
            row.rejoin(msg)
            row.take_hello(msg)

    def _on_step(self, row: RankState, msg: Any, now: float) -> None:
        row.take_step(msg, now)
        if msg.step > row.folded_step:
            if self.hang.stalled:
                self.hang.on_step(row.rank, msg.step)
            row.fold_step(msg.step, msg.step_ms)
            row.count_step(msg)

    def _on_heartbeat(self, row: RankState, msg: Any, now: float) -> None:
        row.take_heartbeat(msg)

    def _on_bye(self, row: RankState, msg: Any, now: float) -> None:
        if row.take_bye(msg, now):
            self.hang.on_bye(row.rank)

    def _on_stall(self, row: RankState, msg: Any, now: float) -> None:
        self.hang.on_stall(msg)
        if msg.state == "stalled":
            self.stall_seen[row.rank] = now

    def _on_event(self, row: RankState, msg: Any, now: float) -> None:
        self.hang.on_event(msg)

    def note_exit(self, rank: int, how: str, detail: str, at: float) -> None:
        """A rank ended without a Bye, learnt otherwise (its log ends, the launcher said how); a
        Bye that did come stands."""
        row = self.ranks.get(rank)
        if row is not None and not row.over:
            row.take_exit(how, detail, at)
            self.hang.on_bye(rank)

    # ------------------------------------------------------------------ readings

    @property
    def is_ended(self) -> bool:
        return run_ended(self.ranks.values(), self.world_size)

    def lifecycle(self, stalled: Iterable[int] | None = None) -> Lifecycle:
        """The run's lifecycle; `stalled`: ranks found not stepping (default: those whose stall
        report stands)."""
        return lifecycle_of(list(self.ranks.values()), world_size=self.world_size, heard=self.heard,
                            restarts_left=restarts_left(self.hello, self.restart),
                            stalled=self.hang.reported_stalled() if stalled is None else stalled)

    def hang_verdict(self) -> HangVerdict | None:
        """Who holds the others up: the fold's own reading of the reports standing, else rank 0's
        latest `hang` event while it stands (as the UI shows it)."""
        own = hang_reading(self.hang, self.ranks, self.world_size)
        return own if own is not None else self.hang.rank0_verdict(self.latest_ts, self.is_ended)

    def stall_s(self, rank: int, now: float) -> float:
        """How long the rank's stalled phase has run by `now` (its report's time, and since); 0: not stalled."""
        report = self.hang.stalled.get(rank)
        if report is None or report.state != "stalled":
            return 0.0
        running = report.running_s if math.isfinite(report.running_s) else 0.0
        return max(0.0, running) + max(0.0, now - self.stall_seen.get(rank, now))


_HANDLERS: dict[str, str] = {"hello": "_on_hello", "step": "_on_step", "heartbeat": "_on_heartbeat",
                             "bye": "_on_bye", "stall": "_on_stall", "event": "_on_event"}
"""Protocol tag -> the method that folds it in."""
