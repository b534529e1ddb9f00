"""A yes/no step before a command that changes the run (a strategy switch, a stop): one key too many
should not reshard or end a training run."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmPrompt(ModalScreen[bool]):
    """Enter or y: dismiss with True; Escape or n: with False (nothing is sent)."""

    DEFAULT_CSS = """
    ConfirmPrompt { align: center middle; }
    #confirm-box { width: 72; height: auto; border: thick $warning; background: $surface; padding: 0 1; }
    #confirm-title, #confirm-detail, #confirm-hint { height: auto; }
    #confirm-hint { margin: 1 0 0 0; }
    """

    BINDINGS = [
        Binding("enter,y", "answer(True)", "yes"),
        Binding("escape,n", "answer(False)", "no"),
    ]

    def __init__(self, title: Text, detail: Text | str = "", yes: str = "yes", note: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.detail = detail
        self.yes = yes
        self.note = note
        """Why the command may not go out now (not connected), shown beside the keys."""

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.title_text, id="confirm-title")
            if self.detail:
                yield Static(self.detail, id="confirm-detail")
            hint = Text(f"Enter/y {self.yes}   Esc/n cancel", style="dim")
            if self.note:
                hint.append(f"   {self.note}", style="bold yellow")
            yield Static(hint, id="confirm-hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ConfirmStop(ConfirmPrompt):
    """Stopping a run cannot be taken back: yes sends `stop`, no sends nothing."""

    def __init__(self, note: str = "") -> None:
        super().__init__(Text("Stop the run?", style="bold"),
                         Text("Every rank stops at its next step boundary and says goodbye; the agents exit. "
                              "This cannot be undone.", style="dim"), yes="stop the run", note=note)
