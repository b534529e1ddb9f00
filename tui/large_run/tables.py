"""What the large-run tables of the Overview, Memory and Comm tabs share: the rows on screen only
(windowed by the nav), the ranks a level lists, a node row's marks, and figures held between
refreshes (they are O(ranks))."""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text

from ringtop.tui.large_run.nav import OverviewNav
from ringtop.tui.state.marks import marked_note
from ringtop.tui.state.nodes import filter_ranks
from ringtop.tui.state.view_model import RunView

AGGREGATE_ABOVE = 256
AGGREGATE_EVERY_S = 1.0
"""A live run above AGGREGATE_ABOVE ranks: its node rows, heat strip and outliers at most this often."""


def marked_cells(cells: dict[str, Text], ranks: tuple[int, ...], marks: dict) -> dict[str, Text]:
    """A Memory or Comm node row whose note names its hung or flagged ranks (tui/state/marks.py)."""
    if "note" in cells and marks:
        cells = {**cells, "note": marked_note(ranks, marks, cells["note"])}
    return cells


def window_rows(nav: OverviewNav, visible: int, items: list, rows_of) -> tuple:
    """(rows, cursor, cursor key, first row, total) of a large run's table: `items` (its nodes or
    ranks, sorted) windowed by `nav` to the `visible` rows on screen, and only those built."""
    total = len(items)
    first, cur = nav.window(total, visible or total)
    rows = rows_of(items[first:first + (visible or total)])
    cursor = cur - first if rows else None
    return rows, cursor, (rows[cursor][0] if cursor is not None else None), first, total


def level_ranks(view: RunView, nav: OverviewNav, level: str, hosts: dict[int, str]) -> list[int]:
    """The ranks a table lists below the nodes: an opened node's, or those the filter names."""
    if level == "node":
        return [r for r, h in hosts.items() if h == nav.host]
    return filter_ranks(nav.filter, list(view.ranks.values()), view.facts.world_size)


class Held:
    """One table's large-run figures, kept between refreshes."""

    def __init__(self) -> None:
        self.last: tuple | None = None
        """(shape, version, when, value) of the latest computation."""

    @property
    def value(self) -> Any:
        return self.last[3] if self.last is not None else None

    def get(self, now: float, shape: tuple, version: object, throttle: bool, compute: Callable[[], Any]) -> Any:
        """The figures, recomputed when their shape (ranks, width, …) or the view's `version` of
        them moved on (None: always), but while `throttle` at most once per AGGREGATE_EVERY_S: they
        are O(ranks), and a node's median needs no 4 Hz."""
        held = self.last
        if held is not None and held[0] == shape and (
                (version is not None and held[1] == version) or (throttle and 0 <= now - held[2] < AGGREGATE_EVERY_S)):
            return held[3]
        value = compute()
        self.last = (shape, version, now, value)
        return value
