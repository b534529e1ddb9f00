"""The keys help (`?`): every key of the app with what it does, from the same tables the
footer and the palette are made of (run_commands.RUN_COMMANDS, large_run.keys.OVERVIEW_KEYS), so
that it cannot say a key the app does not have. Escape (or `?`, `q`) closes it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ringtop.tui.large_run.keys import OVERVIEW_KEYS
from ringtop.tui.run_commands import RUN_COMMANDS

KEY_NAMES = {
    "slash": "/",
    "enter": "Enter",
    "escape": "Esc",
    "up": "↑",
    "down": "↓",
    "pageup": "PgUp",
    "pagedown": "PgDn",
    "home": "Home",
    "end": "End",
}
MOVES = ("↑ ↓ PgUp PgDn Home End", "move through a large run's rows")


def keys_help_rows(tabs: tuple[str, ...]) -> list[tuple[str, list[tuple[str, str]]]]:
    """(section, [(keys, what they do)]) in the order the help shows them."""
    commands = [(c.key, f"{c.title.rstrip('…')}: {c.help}") for c in RUN_COMMANDS]
    table = [(KEY_NAMES.get(k.key, k.key), f"{k.title.rstrip('…')}: {k.help}") for k in OVERVIEW_KEYS if k.title]
    screen = [
        (f"1-{len(tabs)}", "tabs: " + ", ".join(t.capitalize() for t in tabs)),
        ("r", "Comm tab: all ranks, then one rank at a time"),
        ("b", "bundle for a bug report: `ringtop bundle` of this run, one .tar.gz in its log folder"),
        ("ctrl+p", "command palette: type to filter, Enter runs the highlighted command"),
        ("?", "this help"),
        ("q", "quit the UI (the run goes on)"),
    ]
    return [
        ("run commands (live runs only; the footer shows those the run can take now)", commands),
        ("large runs' tables (Overview, Memory, Comm)", [*table, MOVES]),
        ("screen", screen),
    ]


def keys_help_text(tabs: tuple[str, ...]) -> Text:
    text = Text("Keys", style="bold")
    for section, rows in keys_help_rows(tabs):
        text.append(f"\n\n{section}", style="bold cyan")
        width = max(len(keys) for keys, _ in rows)
        for keys, what in rows:
            text.append(f"\n{keys:>{width}}  ", style="bold")
            text.append(what)
    text.append("\n\nEsc close", style="dim")
    return text


class KeysHelp(ModalScreen[None]):
    DEFAULT_CSS = """
    KeysHelp { align: center middle; }
    #keys-box { width: 100; height: auto; max-height: 90%; border: thick $accent; background: $surface;
                padding: 0 1; }
    """

    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def __init__(self, tabs: tuple[str, ...]) -> None:
        super().__init__()
        self.tabs = tabs

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="keys-box"):
            yield Static(keys_help_text(self.tabs), id="keys-text")

    def action_close(self) -> None:
        self.dismiss(None)
