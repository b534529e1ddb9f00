"""Rank 0's reading of the whole run's stall reports and step digests, on the relay's thread.

It sees every rank's messages as the relay forwards them, so it names a hung, dead or
desynchronised rank in the logs (an `Event` of kind `hang` or `desync`) even when rank 0's own
training thread is among the stuck ones. The reading itself is `metrics.hang`, which the UI runs
too.
"""

from __future__ import annotations

import socket
import time
from collections import OrderedDict
from typing import Callable

from ringtop.metrics.rules.hang import STARTING, HangVerdict, diagnose, step_desync
from ringtop.metrics.rules.liveness import is_silent
from ringtop.protocol import Bye, HangReport, Heartbeat, Hello, Message, RankExit, RankLook, Stall, Step
from ringtop.protocol.processes import look

SETTLE_S = 0.6
"""After a stall's first report, wait this long for the other ranks' before naming anyone."""
RESTATE_S = 30.0
STEPS_KEPT = 16

EmitEvent = Callable[[str, str, str, HangReport], None]
"""(level, kind, text, reading): sends it as rank 0's `Event`."""


class HangWatch:
    def __init__(self, world_size: int, emit_event: EmitEvent, clock: Callable[[], float] = time.monotonic) -> None:
        self.world_size = world_size
        self._emit = emit_event
        self._clock = clock
        self._reports: dict[int, Stall] = {}
        self._seen: dict[int, float] = {}
        self._failed: set[int] = set()
        self.said_bye: set[int] = set()
        """Ranks whose Bye has come through."""
        self._episode_since: float | None = None
        self._last_key: tuple | None = None
        self._last_emit = 0.0
        self.verdict: HangVerdict | None = None
        self._cursors: OrderedDict[int, dict[int, list]] = OrderedDict()
        self._desyncs_named: set[tuple[str, tuple[int, ...]]] = set()
        self._host = socket.gethostname()
        self._local: dict[int, tuple[int, float]] = {}
        """rank -> (pid, process start) of the ranks on this host, from their Hellos: a silent one
        whose process is alive is stuck (e.g. holding the GIL), not gone. Without the start in its
        Hello a pid is not taken as that rank's process."""

    def observe(self, msg: Message) -> None:
        now = self._clock()
        if isinstance(msg, RankLook):  # a watcher saw it alive: silence is no death anyway
            return
        if isinstance(msg, RankExit):  # its node's watcher saw the process gone
            self._failed.add(msg.of_rank)
            self._local.pop(msg.of_rank, None)
            if self._reports:
                self._evaluate(now)
            return
        rank = msg.rank
        self._seen[rank] = now
        if isinstance(msg, Stall):
            if msg.state in ("stalled", STARTING):
                self._reports[rank] = msg
                if self._episode_since is None:
                    self._episode_since = now
                self._evaluate(now)
            elif msg.state == "recovered":
                self._recovered(rank, now)
        elif isinstance(msg, Step):
            if rank in self._reports and msg.step >= self._reports[rank].step:
                self._recovered(rank, now)
            if msg.collectives:
                self._check_step(rank, msg)
        elif isinstance(msg, Bye):
            self.said_bye.add(rank)
            self._reports.pop(rank, None)
            if not msg.ok:
                self._failed.add(rank)
                if self._reports:
                    self._evaluate(now)
        elif isinstance(msg, Hello):
            if msg.host == self._host and msg.pid > 0 and msg.process_started_ts > 0:
                self._local[rank] = (msg.pid, msg.process_started_ts)
            else:
                self._local.pop(rank, None)
        elif isinstance(msg, Heartbeat):
            pass

    def _gone(self, now: float) -> set[int]:
        silent = {r for r, t in self._seen.items() if is_silent(now - t) and self._gone_here(r)}
        return self._failed | silent

    def _gone_here(self, rank: int) -> bool:
        """A silent rank of this host whose process is gone. A rank of another node is not gone
        for its silence alone (it may be stuck, or behind a cut link): its node's watcher says how
        it ended (a RankExit), or it is named as one that sent no report."""
        local = self._local.get(rank)
        return local is not None and look(*local) is None

    def _evaluate(self, now: float) -> None:
        if self._episode_since is None:
            return
        if len(self._reports) < self.world_size and now - self._episode_since < SETTLE_S:
            return
        gone = self._gone(now)
        live = {r: report for r, report in self._reports.items() if r not in gone}  # a dead rank's last words
        verdict = diagnose(live, self.world_size, gone) if live else None
        if verdict is None:
            return
        key = (verdict.kind, verdict.culprits, verdict.group, verdict.seq, tuple(sorted(verdict.where.items())))
        if key == self._last_key and now - self._last_emit < RESTATE_S:
            return
        self._last_key, self._last_emit, self.verdict = key, now, verdict
        self._emit("error" if verdict.kind != "stall" else "warn", "hang", verdict.text, report(verdict))

    def _recovered(self, rank: int, now: float) -> None:
        self._reports.pop(rank, None)
        if self._reports or self._episode_since is None:
            return
        lasted = now - self._episode_since
        self._episode_since, self._last_key = None, None
        if self.verdict is not None:
            self._emit("info", "hang", f"the stall is over after {lasted:.0f} s: every rank is stepping again",
                       HangReport(verdict="cleared", lasted_s=round(lasted, 3)))
            self.verdict = None

    def _check_step(self, rank: int, msg: Step) -> None:
        ranks = self._cursors.setdefault(msg.step, {})
        ranks[rank] = msg.collectives
        if len(ranks) == self.world_size:
            self._judge_step(msg.step, self._cursors.pop(msg.step))
        while len(self._cursors) > STEPS_KEPT:
            step, partial = self._cursors.popitem(last=False)
            if len(partial) > 1:
                self._judge_step(step, partial)

    def _judge_step(self, step: int, cursors: dict[int, list]) -> None:
        found = step_desync(cursors, step)
        if found is None:
            return
        key = (found.group, found.culprits)
        if key in self._desyncs_named:
            return
        self._desyncs_named.add(key)
        reading = HangReport(verdict="desync", culprits=list(found.culprits), waiting=list(found.agreeing),
                             group=found.group, step=step)
        self._emit("error", "desync", found.text, reading)


def report(verdict: HangVerdict) -> HangReport:
    """The reading as it crosses the wire."""
    return HangReport(verdict=verdict.kind, culprits=list(verdict.culprits), waiting=list(verdict.waiting),
                      group=verdict.group, seq=verdict.seq, collective=verdict.collective,
                      wait_s=round(verdict.wait_s, 3), step=verdict.step, where=dict(verdict.where))
