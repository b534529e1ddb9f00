"""Keep a Textual DataTable equal to a list of rows, touching only the cells that changed.

Columns are (key, label, width, right-aligned); a different column set rebuilds the table (rare:
a GPU run, a new collective kind). Rows are (key, {column key: Text}); a different row set
re-adds the rows, otherwise only changed cells are updated, so a repaint costs little.
"""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text
from textual.widgets import DataTable

DEFAULT_TABLE_WIDTH = 118
"""Before the widget has a size: a 120-column terminal."""


class Column(NamedTuple):
    key: str
    label: str
    width: int
    right: bool = False


def fit_to_width(columns: list[Column], priority: dict[str, int], width: int) -> list[Column]:
    """The columns that fit `width` cells (each costs its width plus 2 of padding), dropping the
    highest `priority` numbers first (a column not named there, or at 0, is always kept); the
    order stays the table's own."""
    kept = list(columns)

    def used() -> int:
        return sum(c.width + 2 for c in kept)

    while used() > width:
        droppable = [c for c in kept if priority.get(c.key, 0) > 0]
        if not droppable:
            break
        kept.remove(max(droppable, key=lambda c: (priority[c.key], kept.index(c))))
    return kept


def cell_signature(cell: Text) -> tuple:
    return cell.plain, str(cell.style), tuple(cell.spans)


class SyncedTable:
    def __init__(self, table: DataTable) -> None:
        self.table = table
        self.columns: tuple[Column, ...] = ()
        self._rows: list[str] = []
        self._cells: dict[tuple[str, str], tuple] = {}

    def set_columns(self, columns: list[Column]) -> bool:
        """Rebuild the table when the columns differ from the current ones; True when rebuilt."""
        cols = tuple(columns)
        if cols == self.columns:
            return False
        self.table.clear(columns=True)
        for c in cols:
            self.table.add_column(Text(c.label, justify="right" if c.right else "left"), width=c.width, key=c.key)
        self.columns = cols
        self._rows = []
        self._cells.clear()
        return True

    def set_rows(self, rows: list[tuple[str, dict[str, Text]]]) -> None:
        keys = [k for k, _ in rows]
        if keys != self._rows:
            keep = self._cursor_key()
            self.table.clear()
            self._cells.clear()
            for key, cells in rows:
                aligned = [self._aligned(c, cells.get(c.key)) for c in self.columns]
                self.table.add_row(*aligned, key=key)
                for c, cell in zip(self.columns, aligned):
                    self._cells[(key, c.key)] = cell_signature(cell)
            self._rows = keys
            if keep in keys:
                self.table.move_cursor(row=keys.index(keep), animate=False)
            return
        for key, cells in rows:
            for c in self.columns:
                cell = self._aligned(c, cells.get(c.key))
                sig = cell_signature(cell)
                if self._cells.get((key, c.key)) != sig:
                    self._cells[(key, c.key)] = sig
                    self.table.update_cell(key, c.key, cell)

    def _cursor_key(self) -> str | None:
        t = self.table
        if not t.row_count or t.cursor_row < 0:
            return None
        try:
            return t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value
        except Exception:
            return None

    @staticmethod
    def _aligned(col: Column, cell: Text | None) -> Text:
        if cell is None:
            cell = Text("")
        cell.justify = "right" if col.right else "left"
        cell.no_wrap = True
        cell.overflow = "ellipsis"
        return cell
