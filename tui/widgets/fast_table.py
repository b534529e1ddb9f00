"""A DataTable whose cells are drawn once per change of the cell, not once per change of the table.

Textual's DataTable keys its cell cache on the table's update count, so one `update_cell` redraws
every visible cell through Rich's console (a Padding in a Styled: ~0.1–0.3 ms a cell), and the
rank tables change every tick (a 1024-rank Overview spent most of its repaint there). Here a
cell that is one line of Text — what `tables.SyncedTable` always gives — is drawn straight from
the Text (cut and padded as Text.wrap would with no_wrap, then its segments styled as Styled would
style them) and kept until that cell's object or its place, style or cursor changes. Anything
else (several lines, tabs, other renderables, rows taller than one line) is drawn by DataTable.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.widgets import DataTable

_JOINER = Text("")
_EMPTY_CELL = Text("")
MAX_CACHED_CELLS = 4_000
"""Cells drawn since the cache's last turn; then they become the previous generation, kept while
the next one fills, and a cell found there moves on to the new one. So the cells on screen stay
drawn and the ones no longer shown go within two turns: at most 8,000 (a table shows a few hundred
cells at a time). One dict of 20,000 that started again when full held ~20 MB at 8 ranks, whose
cells all change every tick, and the UI's RSS rose for the 50 s it took to fill."""


class FastTable(DataTable):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._drawn_cells: dict[tuple, tuple[object, list[list[Segment]]]] = {}
        self._drawn_before: dict[tuple, tuple[object, list[list[Segment]]]] = {}

    def render_lines(self, crop):
        """One pass over the visible lines: each component style (header, even and odd rows,
        cursor) is looked up once, not once a row (a lookup builds a RenderStyles: ~0.1 ms)."""
        self._styles_this_pass = {}
        try:
            return super().render_lines(crop)
        finally:
            self._styles_this_pass = None

    def get_component_styles(self, *names: str):
        memo = getattr(self, "_styles_this_pass", None)
        if memo is None:
            return super().get_component_styles(*names)
        found = memo.get(names)
        if found is None:
            found = memo[names] = super().get_component_styles(*names)
        return found

    def clear(self, columns: bool = False):
        self._drawn_cells.clear()
        self._drawn_before.clear()
        return super().clear(columns)

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int,
                     cursor: bool = False, hover: bool = False) -> list[list[Segment]]:
        if column_index < 0 or (row_index >= 0 and (row_index < self.fixed_rows or column_index < self.fixed_columns)):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if row_index == -1:
            row_key, height = self._header_row_key, self.header_height
            cell = self.ordered_columns[column_index].label
        else:
            row_key = self._row_locations.get_key(row_index)
            row = self.rows[row_key]
            height = row.height
            cells = self._data.get(row_key)
            column_key = self._column_locations.get_key(column_index)
            cell = cells.get(column_key) if cells is not None else None
        if isinstance(cell, Text) and not cell.plain:
            cell = _EMPTY_CELL  # as DataTable: an empty cell has no style of its own
        if (height != 1 or not isinstance(cell, Text) or cell.justify == "full" or "\n" in cell.plain
                or "\t" in cell.plain):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (row_key, column_index, row_index, id(cell), width, base_style, cursor, hover, self._show_hover_cursor,
               self.show_cursor, self._pseudo_class_state)
        hit = self._drawn_cells.get(key)
        if hit is not None and hit[0] is cell:  # the very object: an id alone may be a new cell's
            return hit[1]
        hit = self._drawn_before.pop(key, None)
        if hit is not None and hit[0] is cell:
            self._keep(key, hit)
            return hit[1]
        component_style, post_style = self._get_styles_to_render_cell(
            row_index == -1, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css")
        pre_style = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
        lines = [self._draw(cell, width, pre_style, post_style)]
        self._keep(key, (cell, lines))
        return lines

    def _keep(self, key: tuple, drawn: tuple[object, list[list[Segment]]]) -> None:
        if len(self._drawn_cells) >= MAX_CACHED_CELLS:
            self._drawn_before, self._drawn_cells = self._drawn_cells, {}
        self._drawn_cells[key] = drawn

    def _draw(self, cell: Text, width: int, pre_style: Style, post_style: Style) -> list[Segment]:
        """`cell` in `width` cells with the table's padding, as console.render_lines(Styled(Padding(cell)))
        draws one line (Text.wrap's no_wrap branch: Lines.justify, then truncate)."""
        pad = self.cell_padding
        inner = max(0, width - 2 * pad)
        line = cell.copy()
        justify, overflow = cell.justify or "default", cell.overflow or "fold"
        if justify in ("right", "center"):
            line.rstrip()
            line.truncate(inner, overflow=overflow)
            left = inner - line.cell_len if justify == "right" else (inner - line.cell_len) // 2
            line.pad_left(left)
            line.pad_right(inner - line.cell_len)
        elif justify == "left":
            line.truncate(inner, overflow=overflow, pad=True)
        else:  # "default": cut, the rest left unstyled
            line.truncate(inner, overflow=overflow)
        line = _JOINER.join([line])  # its base style becomes a span, as Text's own drawing does
        segments = [Segment(" " * pad), *line.render(self.app.console, end="")]
        short = inner - line.cell_len
        if short > 0:
            segments.append(Segment(" " * short))
        segments.append(Segment(" " * pad))
        return list(Segment.apply_style(segments, pre_style, post_style))
