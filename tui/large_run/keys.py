"""The keys of a large run's tables — open a node, back, sort, filter, move through the rows —
declared once for the bindings, the footer and the command palette, as tui/run_commands.py does
for the run's commands. They are offered only on a tab with such a table (Overview, Memory, Comm)
of a run above SCALE_ABOVE ranks, and act on that tab's own `OverviewNav`: a small run's screen
stays as it was."""

from __future__ import annotations

from typing import Iterable, NamedTuple

from textual.app import SystemCommand
from textual.binding import Binding

from ringtop.tui.large_run.nav import OverviewNav
from ringtop.tui.screens import FilterPrompt


class OverviewKey(NamedTuple):
    action: str
    key: str
    title: str
    help: str
    footer: str = ""
    """The footer's word; empty: not in the footer (the keys that only move)."""


OVERVIEW_KEYS = (
    OverviewKey("overview_open", "enter", "Open the node", "the node under the cursor: one row per rank", "open"),
    OverviewKey("overview_back", "escape", "Back", "clear the filter, or back from a node's ranks to the nodes",
                "back"),
    OverviewKey("overview_sort", "o", "Sort the rows",
                "cycle the tab's orders (Overview: step time, memory, idle, rank; Memory: memory, state, rank; "
                "Comm: compute, exposed comm, rank)", "sort"),
    OverviewKey("overview_filter", "slash", "Filter the ranks…", "ranks (517, 0-15, 0-1023/128) or a host's name",
                "filter"),
    OverviewKey("overview_move(-1)", "up", "", ""),
    OverviewKey("overview_move(1)", "down", "", ""),
    OverviewKey("overview_page(-1)", "pageup", "", ""),
    OverviewKey("overview_page(1)", "pagedown", "", ""),
    OverviewKey("overview_end(0)", "home", "", ""),
    OverviewKey("overview_end(1)", "end", "", ""),
)
OVERVIEW_ACTIONS = frozenset(k.action.partition("(")[0] for k in OVERVIEW_KEYS)
OVERVIEW_BINDINGS = [Binding(k.key, k.action, k.footer or k.title, show=bool(k.footer)) for k in OVERVIEW_KEYS]


class OverviewKeys:
    """Mixed into the App (`self` is the RingtopApp): the actions behind the keys above, on the
    table of the tab on screen."""

    navs: dict[str, OverviewNav]
    table_cursor_keys: dict[str, str | None]
    table_page_rows: dict[str, int]

    @property
    def tab_nav(self) -> OverviewNav | None:
        return self.navs.get(self.active_tab)

    def overview_allowed(self, action: str) -> bool | None:
        """Only on a tab with a large run's table; Enter only on the node rows, Escape only where
        there is something to leave."""
        if action not in OVERVIEW_ACTIONS:
            return True
        nav, ranks = self.tab_nav, len(self.view.ranks)
        if nav is None or not nav.scaled(ranks):
            return False
        if action == "overview_open":
            return nav.level(ranks) == "nodes"
        if action == "overview_back":
            return bool(nav.filter) or nav.host is not None
        return True

    def overview_system_commands(self) -> Iterable[SystemCommand]:
        for k in OVERVIEW_KEYS:
            if k.title and self.overview_allowed(k.action.partition("(")[0]):
                key = "/" if k.key == "slash" else k.key
                yield SystemCommand(f"{k.title}  ({key})", k.help, getattr(self, f"action_{k.action}"))

    def _moved(self, move) -> None:
        nav = self.tab_nav
        if nav is not None:
            move(nav)
            self.overview_changed()

    def action_overview_open(self) -> None:
        key = self.table_cursor_keys.get(self.active_tab)
        if key and key.startswith("n"):
            self._moved(lambda nav: nav.open(key[1:]))

    def action_overview_back(self) -> None:
        nav = self.tab_nav
        if nav is not None and nav.back():
            self.overview_changed()

    def action_overview_sort(self) -> None:
        self._moved(lambda nav: nav.next_sort(len(self.view.ranks)))  # the table's caption says by what

    def action_overview_filter(self) -> None:
        nav = self.tab_nav
        if nav is None or isinstance(self.screen, FilterPrompt):
            return
        self.push_screen(FilterPrompt(nav.filter), callback=lambda text: self._on_filter(nav, text))

    def _on_filter(self, nav: OverviewNav, text: str | None) -> None:
        if text is not None:
            nav.set_filter(text)
            self.overview_changed()

    def action_overview_move(self, delta: int) -> None:
        self._moved(lambda nav: nav.move(delta))

    def action_overview_page(self, pages: int) -> None:
        rows = max(1, self.table_page_rows.get(self.active_tab, 1))
        self._moved(lambda nav: nav.page(pages, rows))

    def action_overview_end(self, end: int) -> None:
        self._moved(lambda nav: nav.to_end(bool(end)))
