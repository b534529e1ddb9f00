"""Where the Overview's user is in a large run: the node opened (if any), the sort, the filter, the
cursor and the first row on screen. Pure state the keys change and the builder reads; the table
is built for the rows on screen only, so the window is kept here, not in the DataTable."""

from __future__ import annotations

from dataclasses import dataclass

from .nodes import SORT_KEYS

SCALE_ABOVE = 32
"""More ranks than this: the Overview shows one row per node (a node's ranks on Enter)."""


@dataclass
class OverviewNav:
    host: str | None = None
    """The node whose ranks are shown (Enter on its row); None: the node rows."""
    sort: str | None = None
    """A SORT_KEYS key; None: the view's own (slowest first for nodes and a node's ranks, rank
    order for a small run's table)."""
    filter: str = ""
    """Ranks (`517`, `0-15`) or a host's name, typed after `/`; shows the matching ranks."""
    cursor: int = 0
    offset: int = 0
    """The first row on screen."""
    _host_cursor: int = 0

    def scaled(self, ranks: int) -> bool:
        return ranks > SCALE_ABOVE

    def level(self, ranks: int) -> str:
        """"ranks" (a small run's table, or the ranks a filter matched), "nodes" or "node"."""
        if self.filter or not self.scaled(ranks):
            return "ranks"
        return "node" if self.host is not None else "nodes"

    def sort_key(self, ranks: int) -> str:
        if self.sort is not None:
            return self.sort
        return "step" if self.scaled(ranks) else "rank"

    def next_sort(self, ranks: int) -> str:
        keys = SORT_KEYS
        self.sort = keys[(keys.index(self.sort_key(ranks)) + 1) % len(keys)]
        self.cursor = self.offset = 0
        return self.sort

    def open(self, host: str) -> None:
        self._host_cursor = self.cursor
        self.host, self.cursor, self.offset = host, 0, 0

    def set_filter(self, text: str) -> None:
        self.filter, self.cursor, self.offset = text.strip(), 0, 0

    def back(self) -> bool:
        """Escape: the filter goes first, then the node; False when there was nothing to leave."""
        if self.filter:
            self.set_filter("")
            return True
        if self.host is not None:
            self.host, self.cursor, self.offset = None, self._host_cursor, 0
            return True
        return False

    def move(self, delta: int) -> None:
        self.cursor = max(0, self.cursor + delta)

    def page(self, pages: int, rows: int) -> None:
        """PgUp / PgDn: the cursor and the rows on screen move on by a screenful together."""
        self.cursor = max(0, self.cursor + pages * rows)
        self.offset = max(0, self.offset + pages * rows)

    def to_end(self, end: bool) -> None:
        self.cursor = 1 << 30 if end else 0

    def window(self, total: int, rows: int) -> tuple[int, int]:
        """(first row on screen, cursor) for `total` rows of which `rows` fit, the cursor kept on
        screen and within the rows (they come and go)."""
        rows = max(1, rows)
        self.cursor = min(self.cursor, max(0, total - 1))
        if self.cursor < self.offset:
            self.offset = self.cursor
        elif self.cursor >= self.offset + rows:
            self.offset = self.cursor - rows + 1
        self.offset = max(0, min(self.offset, total - rows))
        return self.offset, self.cursor
