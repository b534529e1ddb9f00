"""The parts' state where the screens always read it (`view.events`, `view.commands`, …): the
event log, the operations, the verdicts, the step history and the communication ledger, each its
own reducer (tui/state/reducers). Mixed into `RunView`."""

from __future__ import annotations

from collections import deque
from typing import Any

from ringtop.tui.state.reducers import CommandState, Diagnosis, EventLine, VerdictState
from ringtop.tui.state.reducers.comm import CommStep
from ringtop.tui.state.reducers.steps import StepPoint


class PartsAccess:
    """Mixed into `RunView`."""

    def events_since(self, seq: int) -> list[EventLine]:
        """Event lines with `seq >= seq` still held (older ones may have been dropped)."""
        return self.event_log.since(seq)
    @property
    def events(self) -> deque[EventLine]:
        return self.event_log.lines
    @property
    def events_total(self) -> int:
        return self.event_log.total
    @property
    def last_warning(self) -> EventLine | None:
        return self.event_log.last_warning
    @property
    def commands(self) -> dict[str, CommandState]:
        return self.command_log.commands
    def note_command_sent(self, cmd_id: str, cmd: str, args: dict[str, Any] | None = None) -> CommandState:
        """The UI sent a command; it is `pending` until a Reply arrives."""
        return self.command_log.sent(cmd_id, cmd, args)
    def active_commands(self) -> list[CommandState]:
        return self.command_log.active()
    def recent_commands(self, n: int = 6) -> list[CommandState]:
        return self.command_log.recent(n)
    @property
    def verdicts(self) -> dict[tuple[str, int | None], VerdictState]:
        return self.verdict_board.verdicts
    @property
    def cleared_verdicts(self) -> deque[VerdictState]:
        return self.verdict_board.cleared
    @property
    def diagnosis(self) -> Diagnosis | None:
        return self.verdict_board.diagnosis
    @property
    def steps(self) -> deque[StepPoint]:
        return self.step_history.points
    @property
    def comm_steps(self) -> dict[int, CommStep]:
        return self.comm_ledger.steps
    @property
    def comm_version(self) -> int:
        """Moves on whenever anything the Comm tab shows may have changed (steps, predictions,
        the link peak, who is live): panels recompute its figures only then."""
        return self.versions["comm"]
    @property
    def comm_kinds(self) -> list[str]:
        """Collective kinds seen in this run's steps (since the strategy last changed), in
        COMM_KIND_ORDER, others after it alphabetically."""
        return self.comm_ledger.kinds
    @property
    def active_verdicts(self) -> list[VerdictState]:
        """Verdicts in force, newest first."""
        return self.verdict_board.active
