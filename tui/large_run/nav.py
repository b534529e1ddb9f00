"""Where the user is in a large run's table (the Overview's, the Memory tab's, the Comm tab's): the
node opened (if any), the sort, the filter, the cursor and the first row on screen. Pure state the
keys change and the panels read; a table is built for the rows on screen only, so the window is
kept here, not in the DataTable. One per tab, each with its own orders (`sort_keys`)."""

from __future__ import annotations

from dataclasses import dataclass

from ringtop.tui.state.nodes import COMM_SORT_KEYS, MEMORY_SORT_KEYS, SORT_KEYS

SCALE_ABOVE = 32
"""More ranks than this: the tables show one row per node (a node's ranks on Enter)."""


@dataclass
class OverviewNav:
    sort_keys: tuple[str, ...] = SORT_KEYS
    """What `o` cycles through; the first is a large run's order until one is chosen."""
    small_sort: str = "rank"
    """A small run's order (its table as always)."""
    host: str | None = None
    """The node whose ranks are shown (Enter on its row); None: the node rows."""
    sort: str | None = None
    """One of `sort_keys`; None: the view's own (the first of `sort_keys` for nodes and a node's
    ranks, `small_sort` for a small run's table)."""
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
        return self.sort_keys[0] if self.scaled(ranks) else self.small_sort

    def next_sort(self, ranks: int) -> str:
        keys, now = self.sort_keys, self.sort_key(ranks)
        self.sort = keys[(keys.index(now) + 1) % len(keys) if now in keys else 0]
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


def memory_nav() -> OverviewNav:
    """The Memory tab's: most memory first."""
    return OverviewNav(sort_keys=MEMORY_SORT_KEYS)


def comm_nav() -> OverviewNav:
    """The Comm tab's: the most compute per step (the rank the others wait for) first."""
    return OverviewNav(sort_keys=COMM_SORT_KEYS)
