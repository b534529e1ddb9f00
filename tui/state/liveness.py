"""Whether the run is heard, and how it ended: the connection state, the run's lifecycle (one
state the header, health line, footer and exit code read: metrics/run_lifecycle.py), the hosts
cut off. Mixed into `RunView`."""

from __future__ import annotations

from typing import Iterable

from ringtop.metrics.rules import liveness
from ringtop.metrics.run_lifecycle import Lifecycle
from ringtop.metrics.run_state.rules import lifecycle_of, restarts_left, run_ended

CONNECTION_STATES = ("waiting", "live", "stale", "restarting", "ended", "stopped", "failed")
DEAD_AFTER_S = liveness.SILENT_AFTER_S
"""A rank silent this long (metrics/rules/liveness.py), while the UI still hears other ranks or another
rank has ended, is marked dead: killed, or its whole process is hung."""


STUCK_LOOK_VALID_S = 3.0
"""A look from outside that found a silent rank's process alive holds this long (the UI looks
every second): past it, with no newer look (the process gone, or the look failing), the silence
rule decides."""


class RunLiveness:
    """Mixed into `RunView`: reads its rows, its clock of the last message and its event log."""

    def connection_state(self, now: float) -> str:
        if self._last_rx is None:
            return "waiting"
        if self.is_ended:
            return self.lifecycle().state
        return "live" if now - self._last_rx <= self.stale_after_s else "stale"
    def lifecycle(self, stalled: Iterable[int] = ()) -> Lifecycle:
        """The run's lifecycle (metrics/run_state/rules.py `lifecycle_of`, as the exporter and `summary`
        read it) from its ranks' ends; `stalled`: the ranks the caller finds not stepping
        (tui/state/health.py's `stalled_ranks`)."""
        return lifecycle_of(list(self.ranks.values()), world_size=self.facts.world_size,
                            heard=self._last_rx is not None,
                            restarts_left=restarts_left(self.facts.hello, self.restart), stalled=stalled,
                            how_silent="died", detail_silent=f"no message for {DEAD_AFTER_S:.0f} s")
    def _say_the_end(self, ts: float) -> None:
        """Once the run is over: one event that says how, and no command left in flight."""
        if not self.is_ended:
            return
        if not self._end_reported:
            self._end_reported = True
            life = self.lifecycle()
            if life.state == "failed":
                self.event_log.add("error", None, f"the run failed: {life.words}", ts, kind="failed")
            elif life.state == "restarting":
                self.event_log.add("warn", None, f"the attempt failed: {life.words}", ts, kind="failed")
            elif life.state == "stopped":
                self.event_log.add("info", None, f"the run {life.words}", ts, kind="ended")
            else:
                self.event_log.add("info", None, f"every rank said bye: the run has ended ({life.words})", ts,
                                   kind="ended")
        if self.command_log.end_pending(ts):
            self.versions["commands"] += 1
    @property
    def is_ended(self) -> bool:
        """Every rank we know of said Bye or died (and, when the world size is known, all of them)."""
        return run_ended(self.ranks.values(), self.facts.world_size)
    @property
    def failure(self) -> str | None:
        """Of a failed run, what failed first, in words (metrics/run_lifecycle.py); None otherwise.
        A rank that dies takes its peers down with it, and their errors arrive first: the dead rank
        went silent before them, so it is named."""
        life = self.lifecycle()
        return life.words if life.state == "failed" else None
    def _hosts_cut_off(self) -> frozenset[str]:
        """Hosts none of whose live ranks was heard for the silence limit while a rank of another
        host was: their node relay gone or the link to the head cut. Their ranks may well train on,
        so they are not declared dead; a node that did die leaves its peers waiting in a collective,
        and the peers' stall reports say so. Only a live view: a replay's arrival times say nothing."""
        if not self.watch_liveness:
            return frozenset()
        limit = min(self.stale_after_s, DEAD_AFTER_S)
        heard: set[str] = set()
        quiet: set[str] = set()
        for r in self.ranks.values():
            if r.host and not (r.ended or r.dead or r.last_seen is None):
                (quiet if r.silent_s > limit else heard).add(r.host)
        return frozenset(quiet - heard) if heard else frozenset()
