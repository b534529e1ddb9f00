"""The command palette, with Enter acting on what the user typed.

Textual's palette searches as each key comes in and shows the result when the search is done; an
Enter that arrives before then selected the highlighted entry of the list still on screen. A
search that matches nothing takes longest (the providers are waited for), so typing `micro` on a
ddp run and Enter ran the first entry of the unfiltered list: a full checkpoint. Here Enter
during a search waits for it, then selects its highlighted match, or nothing when none matched."""

from __future__ import annotations

from textual import on
from textual.command import CommandPalette
from textual.widgets import Input
from textual.worker import Worker, WorkerState


class RingtopPalette(CommandPalette):
    """CommandPalette whose Enter selects the highlighted match of the text typed so far."""

    enter_waiting = False
    """Enter came while a search ran: select once it is done."""

    def searching(self) -> bool:
        return any(
            w.node is self
            and w.group == self._GATHER_COMMANDS_GROUP
            and w.state in (WorkerState.PENDING, WorkerState.RUNNING)
            for w in self.workers
        )

    @on(Input.Submitted)
    def _enter_after_search(self, event: Input.Submitted) -> None:
        if self.searching():
            event.prevent_default()  # the base class's handler would select from the list before
            event.stop()
            self.enter_waiting = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if (
            self.enter_waiting
            and event.worker.group == self._GATHER_COMMANDS_GROUP
            and event.state == WorkerState.SUCCESS
            and not self.searching()
        ):
            self.enter_waiting = False
            self._select_or_command()
