"""How a rank that fell silent ended, or that it did not, as far as this UI can learn outside the
telemetry.

Rank 0 carries the relay every rank's telemetry passes through: when it dies, the UI hears no
rank at all and cannot tell from the messages who died. Two witnesses can: the launcher (when
`ringtop run --ui` started the ranks, its report names the signal that ended each one) and, for
ranks on this host, their process. A silent rank whose process is gone has died; one whose
process is alive is stuck (metrics/rules/liveness.py), and where py-spy is installed its stuck
thread's stack is read from outside, off the UI's thread (protocol/native_stack.py).
"""

from __future__ import annotations

import socket
from typing import Callable

from ringtop.metrics.rules.liveness import stuck_words
from ringtop.protocol import native_stack
from ringtop.protocol.processes import CpuUse, look, process_gone
from ringtop.tui.state.liveness import DEAD_AFTER_S
from ringtop.tui.state.view_model import RunView

LauncherExits = Callable[[], "dict[int, str] | None"]
"""None while the launcher runs; once it has exited, rank -> how it ended (`killed by SIGKILL`)
for the ranks its report names."""
LauncherFailed = Callable[[], "dict[int, str]"]
"""While the launcher runs: pid -> how each worker it saw fail ended (protocol/run_logs.py
LauncherFailures), so a rank killed under `--max-restarts` is named before the launcher ends."""
PROBE_EVERY_S = 1.0
LOOK_AFTER_S = DEAD_AFTER_S / 2
"""A silent local rank's process is looked at from here on: before the silence rule would call it dead."""
LAUNCHER_SAID = "the launcher's report"


class ExitProbe:
    """Asks the witnesses at most every PROBE_EVERY_S and tells the view (`note_rank_exit`,
    `note_rank_stuck`)."""

    def __init__(self, launcher: LauncherExits | None = None, host: str | None = None,
                 read_stacks: bool = True, launcher_failed: LauncherFailed | None = None) -> None:
        self.launcher = launcher
        self.launcher_failed = launcher_failed
        self.host = socket.gethostname() if host is None else host
        self._at = -1e9
        self.stacks = native_stack.StackReader(read_stacks)
        self._cpu = CpuUse()

    def probe(self, view: RunView, now: float) -> None:
        if now - self._at < PROBE_EVERY_S or not view.ranks:
            return
        self._at = now
        launcher = self.launcher() if self.launcher is not None else None
        failed = self.launcher_failed() if self.launcher_failed is not None else {}
        for row in view.ranks.values():
            if row.ended or row.last_seen is None or now - row.last_seen <= LOOK_AFTER_S:
                continue
            local = row.pid > 0 and row.host == self.host
            known = local and row.process_started_ts > 0 and not row.exit_how  # the start tells its process
            seen = look(row.pid, row.process_started_ts) if known else None
            if seen is not None:
                cpu_pct = self._cpu.pct(row.rank, seen.cpu_s, now)
                if now - row.last_seen > DEAD_AFTER_S:
                    words = stuck_words(seen.state, self.stacks.latest(row.rank, row.pid), cpu_pct)
                    view.note_rank_stuck(row.rank, words, now)
                else:  # silent a while: alive, as yet nothing more
                    row.stuck_seen = now
                continue
            if row.pid in failed and row.exit_detail != LAUNCHER_SAID:  # this process, as the launcher saw it fail
                view.note_rank_exit(row.rank, failed[row.pid], LAUNCHER_SAID)
                continue
            if now - row.last_seen <= DEAD_AFTER_S:
                continue
            if launcher is not None:  # the last word: it saw each rank end
                how = launcher.get(row.rank)
                if row.exit_detail != LAUNCHER_SAID and (how or not row.exit_how):
                    view.note_rank_exit(row.rank, how or "ended without a Bye",
                                        LAUNCHER_SAID if how else "the launcher has exited")
            elif not row.exit_how and local and process_gone(row.pid):
                view.note_rank_exit(row.rank, "died", f"its process {row.pid} is gone")
        relay = view.ranks.get(0)
        if relay is not None and relay.dead and relay.ended_at is not None:
            # every rank's telemetry came through rank 0's relay: who fell silent first says nothing
            for row in view.ranks.values():
                if row.rank and row.dead and row.ended_at is not None and row.ended_at < relay.ended_at:
                    row.ended_at = relay.ended_at
