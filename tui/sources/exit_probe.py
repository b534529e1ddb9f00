"""How a rank that fell silent ended, as far as this UI can learn outside the telemetry.

Rank 0 carries the relay every rank's telemetry passes through: when it dies, the UI hears no
rank at all and cannot tell from the messages who died. Two witnesses can: the launcher (when
`ringtop run --ui` started the ranks, its report names the signal that ended each one) and, for
ranks on this host, whether their process still exists.
"""

from __future__ import annotations

import socket
from typing import Callable

from ringtop.protocol.processes import process_gone
from ringtop.tui.state.liveness import DEAD_AFTER_S
from ringtop.tui.state.view_model import RunView

LauncherExits = Callable[[], "dict[int, str] | None"]
"""None while the launcher runs; once it has exited, rank -> how it ended (`killed by SIGKILL`)
for the ranks its report names."""
PROBE_EVERY_S = 1.0
LAUNCHER_SAID = "the launcher's report"


class ExitProbe:
    """Asks the witnesses at most every PROBE_EVERY_S and tells the view (`note_rank_exit`)."""

    def __init__(self, launcher: LauncherExits | None = None, host: str | None = None) -> None:
        self.launcher = launcher
        self.host = socket.gethostname() if host is None else host
        self._at = -1e9

    def probe(self, view: RunView, now: float) -> None:
        if now - self._at < PROBE_EVERY_S or not view.ranks:
            return
        self._at = now
        launcher = self.launcher() if self.launcher is not None else None
        for row in view.ranks.values():
            if row.ended or row.last_seen is None or now - row.last_seen <= DEAD_AFTER_S:
                continue
            if launcher is not None:  # the last word: it saw each rank end
                how = launcher.get(row.rank)
                if row.exit_detail != LAUNCHER_SAID and (how or not row.exit_how):
                    view.note_rank_exit(row.rank, how or "ended without a Bye",
                                        LAUNCHER_SAID if how else "the launcher has exited")
            elif not row.exit_how and row.pid > 0 and row.host == self.host and process_gone(row.pid):
                view.note_rank_exit(row.rank, "died", f"its process {row.pid} is gone")
        relay = view.ranks.get(0)
        if relay is not None and relay.dead and relay.ended_at is not None:
            # every rank's telemetry came through rank 0's relay: who fell silent first says nothing
            for row in view.ranks.values():
                if row.rank and row.dead and row.ended_at is not None and row.ended_at < relay.ended_at:
                    row.ended_at = relay.ended_at
