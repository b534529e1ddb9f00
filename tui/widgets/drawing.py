"""What every panel does to draw a model: touch a widget only when its part of the model changed
(an update costs a layout pass, a table rebuild more)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from ringtop.tui.tables import Column, SyncedTable, cell_signature


def sized_by_css(widget: Static) -> bool:
    """True when the widget's box does not follow its text (neither width nor height `auto`): a new
    text then needs no layout pass of the screen, only a repaint of the widget."""
    width, height = widget.styles.width, widget.styles.height
    return height is not None and not height.is_auto and (width is None or not width.is_auto)


def text_signature(t: Text | None) -> tuple | None:
    """Text's own == ignores its base style; a style-only change must redraw too."""
    return None if t is None else cell_signature(t)


class Drawn:
    """Remembers what each child was last given, per key."""

    def __init__(self) -> None:
        self._shown: dict[str, Any] = {}
        self._tables: dict[str, SyncedTable] = {}

    def text(self, widget: Static, text: Text) -> None:
        key = widget.id or str(id(widget))
        sig = text_signature(text)
        if self._shown.get(key) != sig:
            self._shown[key] = sig
            widget.update(text, layout=not sized_by_css(widget))

    def table(self, widget: DataTable, columns: tuple[Column, ...] | list[Column] | None,
              rows: tuple | list) -> None:
        key = widget.id or str(id(widget))
        synced = self._tables.get(key)
        if synced is None:
            synced = self._tables[key] = SyncedTable(widget)
        if columns is not None:
            synced.set_columns(list(columns))
        synced.set_rows(list(rows))

    def cursor(self, widget: DataTable, cursor: int | None) -> None:
        """A large run's table has a row cursor (the app's keys move it); None: no cursor."""
        cursor_type = "none" if cursor is None else "row"
        if widget.cursor_type != cursor_type:
            widget.cursor_type = cursor_type
        if cursor is not None and widget.cursor_row != cursor:
            widget.move_cursor(row=cursor, animate=False)

    def optional_text(self, widget: Static, text: Text) -> None:
        """A line only some runs have (a large run's caption, its standouts): empty hides it."""
        widget.display = bool(text.plain)
        self.text(widget, text)

    def changed(self, key: str, value: Any) -> bool:
        """True (and remembered) when `value` differs from the last one given for `key`."""
        if self._shown.get(key) == value:
            return False
        self._shown[key] = value
        return True


class TableWidth:
    """Mixed into a panel whose tables drop columns to fit (tables.fit_to_width)."""

    def table_rows(self, share: float) -> int:
        """Rows a large run's table gets when it may take `share` of the panel (its header aside)."""
        return max(3, int(self.content_size.height * share) - 1)

    @property
    def table_width(self) -> int:
        """Cells a table may use (its scrollbar aside); 0 before the first layout."""
        return max(0, self.content_size.width - 2)
