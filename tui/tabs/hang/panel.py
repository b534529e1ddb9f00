"""The Hang view's panel: the run's state in, `HangModel` out; the rows are rebuilt only when the
hang, the ranks or the width changed."""

from __future__ import annotations

from ringtop.tui.panel import Built, Frame
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import DEFAULT_TABLE_WIDTH
from ringtop.tui.tabs.hang.model import HangModel
from ringtop.tui.tabs.hang.render import (
    GROUP_ABOVE,
    hang_caption,
    hang_columns,
    hang_rows,
    rank_states,
    stack_text,
    stacks_reply_text,
)
from ringtop.tui.tabs.hang.widget import HangPanel


class HangTab:
    tab = "hang"
    widget = HangPanel

    def __init__(self) -> None:
        self._hang_key: tuple | None = None
        self._hang: tuple = ((), ())

    def build(self, frame: Frame, widget: HangPanel) -> Built:
        return Built(self.model(frame.view, frame.hang_rank, widget.table_width, replay=frame.replay))

    def model(self, view: RunView, selected: int | None, table_width: int = 0, *, replay: bool) -> HangModel:
        """The Hang view, with the stack of `selected` when a row holds it, else of the first row's
        first rank (the first culprit)."""
        verdict = view.hang_verdict()
        width = table_width or DEFAULT_TABLE_WIDTH
        key = (view.versions["hang"], view.versions["ranks"], verdict.text if verdict else None, width)
        if key != self._hang_key:
            self._hang_key = key
            rows = []
            if verdict is not None or view.hang.snapshots:
                states = rank_states(view, verdict)
                rows = hang_rows(states, group=len(states) > GROUP_ABOVE)
            self._hang = (tuple(hang_columns(rows, width)), tuple(rows))
        columns, rows = self._hang
        shown = [r for r in rows if r.ranks]
        if selected is None or not any(selected in r.ranks for r in shown):
            selected = shown[0].ranks[0] if shown else None
        return HangModel(hang_caption(view, verdict, replay=replay), columns, tuple((r.key, r.cells) for r in rows),
                         stack_text(view, selected), stacks_reply_text(view))
