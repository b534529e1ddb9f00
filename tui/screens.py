"""Modal screens for the actions that need a choice before a command goes out: the strategy switch
picker and the micro-batch prompt (the yes/no prompts: confirm.py). They only return the choice; the app sends
the command."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from ringtop.metrics import fmt
from ringtop.tui.actions import SwitchRow, parse_micro_batches


def _bytes(n: int | None) -> str:
    return fmt.nbytes(n) if n is not None else "-"


class SwitchPicker(ModalScreen[dict[str, Any] | None]):
    """One row per target strategy with the cost model's memory per rank and traffic per step.
    Enter: dismiss with the chosen row's `switch` arguments; Escape: dismiss with None."""

    DEFAULT_CSS = """
    SwitchPicker { align: center middle; }
    #switch-box { width: 96; height: auto; max-height: 90%; border: thick $accent; background: $surface;
                  padding: 0 1; }
    #switch-title { height: auto; margin: 0 0 1 0; }
    #switch-table { height: auto; }
    #switch-hint { height: auto; margin: 1 0 0 0; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    COLUMNS = (("strategy", "strategy", 15), ("sharded", "sharded", 18), ("params", "params", 7),
               ("grads", "grads", 7), ("optim", "optim", 7), ("state", "state/rank", 10), ("wire", "wire/step", 9))

    def __init__(self, rows: list[SwitchRow], title: Text, note: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.title_text = title
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="switch-box"):
            yield Static(self.title_text, id="switch-title")
            yield DataTable(id="switch-table", cursor_type="row", zebra_stripes=True)
            hint = Text("↑↓ choose   Enter switch   Esc cancel", style="dim")
            if self.note:
                hint.append(f"   {self.note}", style="bold yellow")
            yield Static(hint, id="switch-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, width in self.COLUMNS:
            right = key not in ("strategy", "sharded")
            table.add_column(Text(label, justify="right" if right else "left"), width=width, key=key)
        current = 0
        for i, row in enumerate(self.rows):
            mark = "▶ " if row.current else "  "
            style = "bold magenta" if row.current else ""  # the header says "now" in the same colour
            cells = [Text(mark + row.target.label + (" (now)" if row.current else ""), style=style),
                     Text(row.sharded, style="dim" if row.sharded == "-" else ""),
                     *(Text(_bytes(b), justify="right") for b in
                       (row.params_bytes, row.grads_bytes, row.optimizer_bytes)),
                     Text(_bytes(row.total_bytes), justify="right", style="bold"),
                     Text(_bytes(row.sent_bytes), justify="right")]
            table.add_row(*cells, key=row.target.key)
            if row.current:
                current = i
        table.move_cursor(row=current, animate=False)
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        key = event.row_key.value
        chosen = next((r for r in self.rows if r.target.key == key), None)
        if chosen is not None:
            self.dismiss({"key": chosen.target.key, "label": chosen.target.label, "args": dict(chosen.target.args),
                          "current": chosen.current})

    def action_cancel(self) -> None:
        self.dismiss(None)


class MicroBatchesPrompt(ModalScreen[int | None]):
    """Asks for the micro-batch count M. Enter with a whole number >= 1 dismisses with it; anything
    else is refused here with the reason and nothing is sent. Escape dismisses with None."""

    DEFAULT_CSS = """
    MicroBatchesPrompt { align: center middle; }
    #mb-box { width: 64; height: auto; border: thick $accent; background: $surface; padding: 0 1; }
    #mb-title, #mb-error, #mb-hint { height: auto; }
    #mb-error { color: $error; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: Text, value: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.error = ""

    def compose(self) -> ComposeResult:
        with Vertical(id="mb-box"):
            yield Static(self.title_text, id="mb-title")
            yield Input(value=self.value, placeholder="M, a whole number ≥ 1", id="mb-input")
            yield Static("", id="mb-error")
            yield Static(Text("Enter send   Esc cancel", style="dim"), id="mb-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        m, why = parse_micro_batches(event.value)
        if m is None:
            self.error = f"✖ {why}; nothing sent"
            self.query_one("#mb-error", Static).update(self.error)
            self.query_one(Input).select_all()  # the next key replaces the rejected text
            return
        self.dismiss(m)

    def action_cancel(self) -> None:
        self.dismiss(None)


class FilterPrompt(ModalScreen[str | None]):
    """The Overview's filter: ranks (`517`, `0-15`, `0-1023/128`, `1,5,9`) or part of a host's name.
    Enter dismisses with the text (empty: no filter); Escape with None (the filter stays)."""

    DEFAULT_CSS = """
    FilterPrompt { align: center middle; }
    #filter-box { width: 64; height: auto; border: thick $accent; background: $surface; padding: 0 1; }
    #filter-title, #filter-hint { height: auto; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, value: str = "") -> None:
        super().__init__()
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="filter-box"):
            yield Static(Text("Show only these ranks", style="bold"), id="filter-title")
            yield Input(value=self.value, placeholder="517, 0-15, 0-1023/128, or a host: node-07", id="filter-input")
            yield Static(Text("Enter filter (empty: all)   Esc cancel", style="dim"), id="filter-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
