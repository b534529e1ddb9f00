"""The Comm tab's panel: the run's state in, `CommModel` out. A small run: one row per rank. More
than SCALE_ABOVE ranks: one row per node (or a node's ranks, the filtered ranks), each rank's
window read once. The window and chart are recomputed only when the view's comm version moved."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from ringtop.tui.large_run.nav import OverviewNav, comm_nav
from ringtop.tui.large_run.spreads import table_caption
from ringtop.tui.large_run.tables import AGGREGATE_ABOVE, Held, level_ranks, marked_cells, window_rows
from ringtop.tui.panel import Built, Frame
from ringtop.tui.state.marks import rank_marks, troubled_first
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import DEFAULT_TABLE_WIDTH
from ringtop.tui.tabs.comm.figures import busbw_series, comm_window, peak_ref, slowest_rank
from ringtop.tui.tabs.comm.model import CommModel
from ringtop.tui.tabs.comm.render import (
    busbw_label,
    comm_caption,
    exposed_text,
    kinds_columns,
    kinds_rows,
    ranks_columns,
    ranks_rows,
    verdict_panel,
)
from ringtop.tui.tabs.comm.scale import (
    comm_nodes,
    comm_standouts,
    compute_times,
    node_cells,
    node_columns,
    rank_comm,
    sort_comm_nodes,
    sort_comm_ranks,
)
from ringtop.tui.tabs.comm.widget import CommPanel


class CommFigures:
    """(window, busbw series, peak reference) per selection, and the slowest rank, computed once
    per change of the view's communication figures (the Overview's busbw chart reads them too)."""

    def __init__(self) -> None:
        self._version = -1
        self._got: dict[Any, Any] = {}

    def _fresh(self, view: RunView) -> None:
        if view.comm_version != self._version:
            self._version, self._got = view.comm_version, {}

    def data(self, view: RunView, rank: int | None):
        self._fresh(view)
        got = self._got.get(rank)
        if got is None:
            series = busbw_series(view, rank)
            got = self._got[rank] = (comm_window(view, rank), series, peak_ref(view, series))
        return got

    def slowest(self, view: RunView):
        self._fresh(view)
        if "slowest" not in self._got:
            self._got["slowest"] = slowest_rank(view)
        return self._got["slowest"]


class CommTab:
    tab = "comm"
    widget = CommPanel

    def __init__(self, figures: CommFigures | None = None) -> None:
        self.figures = figures or CommFigures()
        self._held = Held()

    def build(self, frame: Frame, widget: CommPanel) -> Built:
        rows = widget.table_rows(widget.TABLE_SHARE)
        model = self.model(frame.view, frame.comm_rank, widget.table_width, nav=frame.navs[self.tab],
                           visible_rows=rows, now=frame.now, replay=frame.replay)
        return Built(model, model.cursor_key, rows)

    def model(self, view: RunView, rank: int | None, table_width: int = 0, *, nav: OverviewNav | None = None,
              visible_rows: int = 0, now: float = 0.0, replay: bool = True) -> CommModel:
        window, series, ref = self.figures.data(view, rank)
        nav, n = nav or comm_nav(), len(view.ranks)
        if not (nav.scaled(n) or nav.filter or nav.sort is not None):
            slow = self.figures.slowest(view)
            return CommModel(comm_caption(view, window, rank, slowest=slow), tuple(kinds_columns(table_width, window)),
                             tuple(kinds_rows(window)), busbw_label(window, ref), tuple(series),
                             exposed_text(window), tuple(ranks_columns(table_width)),
                             tuple(ranks_rows(view, rank, slowest=slow)), verdict_panel(view, slowest=slow))
        width = table_width or DEFAULT_TABLE_WIDTH

        def figures() -> tuple:
            held = self._held.value
            got = rank_comm(view, previous=held[0] if held is not None else None)
            return got, comm_nodes(got), comm_standouts(got, width), slowest_rank(view, compute=compute_times(got))
        figs, nodes, standouts, slow = self._held.get(now, (n, width, replay), view.comm_version,
                                                      not replay and n > AGGREGATE_ABOVE, figures)
        level, sort = nav.level(n), nav.sort_key(n)
        slow_rank = slow.rank if slow is not None else None
        marks = rank_marks(view)
        if level == "nodes":
            columns = node_columns(width)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, troubled_first(sort_comm_nodes(nodes, sort), lambda x: x.ranks, marks,
                                                  lambda x: x.dead),
                lambda shown: [(f"n{node.host}", marked_cells(node_cells(node, slow_rank), node.ranks, marks))
                               for node in shown])
        else:
            columns = ranks_columns(table_width)
            ranks = troubled_first(
                sort_comm_ranks(level_ranks(view, nav, level, {r: x.host for r, x in figs.items()}), figs, sort),
                lambda r: (r,), marks, lambda r: figs[r].dead)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, ranks,
                lambda shown: ranks_rows(view, rank, slowest=slow, rows=[view.ranks[r] for r in shown]))
        table_cap = table_caption(level, nodes=len(nodes), ranks=n, shown=len(rows), first=first, total=total,
                                  sort=sort, host=nav.host, filter_text=nav.filter)
        return CommModel(comm_caption(view, window, rank, slowest=slow), tuple(kinds_columns(table_width, window)),
                         tuple(kinds_rows(window)), busbw_label(window, ref), tuple(series), exposed_text(window),
                         tuple(columns), tuple(rows), verdict_panel(view, slowest=slow), table_caption=table_cap,
                         standouts=standouts if nav.scaled(n) else Text(""), cursor=cursor, cursor_key=cursor_key)
