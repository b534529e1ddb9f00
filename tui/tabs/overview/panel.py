"""The Overview's panel: the run's state in, `OverviewModel` out. A small run: one row per rank,
each rank's cells rebuilt only when its row moved on. More than SCALE_ABOVE ranks (or a filter or
sort chosen): the level the nav is at (nodes, a node's ranks, the filtered ranks), only its rows
on screen built, with the heat strip and the standouts."""

from __future__ import annotations

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.tui.large_run.nav import OverviewNav
from ringtop.tui.large_run.spreads import table_caption
from ringtop.tui.large_run.tables import AGGREGATE_ABOVE, Held, level_ranks, window_rows
from ringtop.tui.panel import Built, Frame
from ringtop.tui.state.health import health_line
from ringtop.tui.state.marks import rank_marks
from ringtop.tui.state.nodes import by_host, node_summaries, nodes_cut_off, rank_figures, sort_nodes, sort_ranks
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import DEFAULT_TABLE_WIDTH
from ringtop.tui.tabs.comm.panel import CommFigures
from ringtop.tui.tabs.comm.render import overview_comm_label
from ringtop.tui.tabs.hang.render import banner_text
from ringtop.tui.tabs.hang.widget import HangBanner
from ringtop.tui.tabs.overview.model import ChartModel, OverviewModel
from ringtop.tui.tabs.overview.parts import run_parts
from ringtop.tui.tabs.overview.render import (
    alert_text,
    breakdown_legend,
    chart_model,
    grad_norm_missing,
    outlying_cells,
    overview_columns,
    row_cells,
)
from ringtop.tui.tabs.overview.scale import (
    STRIP_MAX_LINES,
    heat_strip,
    hosts_caption,
    longest_step_rank,
    node_cells,
    node_columns,
    rank_outliers,
    standouts_text,
)
from ringtop.tui.tabs.overview.widget import OverviewPanel


class OverviewTab:
    tab = "overview"
    widget = OverviewPanel

    def __init__(self, comm: CommFigures | None = None) -> None:
        self.comm = comm or CommFigures()
        """The comm window and busbw series, shared with the Comm tab (one computation per version)."""
        self._kinds: list[str] = []
        self._kinds_width = 0
        self._held = Held()
        self._run_held = Held()
        """The run's step parts: a large live run's once per second (every rank's new steps split)."""
        self._cells: dict[int, tuple[tuple, dict[str, Text]]] = {}
        """Per rank, (what its cells were built from, the cells)."""

    def build(self, frame: Frame, widget: OverviewPanel) -> Built:
        view = frame.view
        rows, strip = widget.budget(len(view.ranks), 4 if widget.query_one(HangBanner).display else 0)
        model = self.model(view, frame.now, replay=frame.replay, table_width=widget.table_width,
                           nav=frame.navs[self.tab], visible_rows=rows, strip_lines=strip)
        return Built(model, model.cursor_key, rows)

    def model(self, view: RunView, now: float, *, replay: bool, table_width: int = 0,
              nav: OverviewNav | None = None, visible_rows: int = 0, strip_lines: int = STRIP_MAX_LINES
              ) -> OverviewModel:
        nav = nav or OverviewNav()
        n = len(view.ranks)
        level, width = nav.level(n), table_width or DEFAULT_TABLE_WIDTH
        caption, strip, standouts, cursor, cursor_key = Text(""), Text(""), Text(""), None, None
        windowed = nav.scaled(n) or bool(nav.filter) or nav.sort is not None
        node_cols = None
        if not windowed:
            rows = self._rank_rows(view, view.rows(), replay, outlying_cells(view))
            hosts = by_host({r.rank: r.host for r in view.ranks.values() if r.host})
            if len(hosts) > 1:
                caption = hosts_caption(hosts, {node.host for node in nodes_cut_off(view)})
        else:
            figures, found, summaries, strip, standouts = self._aggregates(view, now, width, strip_lines, replay)
            outlying = {column: frozenset(r for r, _ in hits) for column, hits in found.items()}
            sort = nav.sort_key(n)
            view.rows()  # the slowest rank, as of now
            if level == "nodes":
                longest = longest_step_rank(summaries)
                rows, cursor, cursor_key, first, total = window_rows(
                    nav, visible_rows, sort_nodes(summaries, sort),
                    lambda shown: [(f"n{node.host}", node_cells(node, longest)) for node in shown])
                node_cols = node_columns(width, tflops_known=any(node.tflops > 0 for node in summaries),
                                         peak_known=any(f.peak_tflops > 0 for f in figures.values()))
            else:
                ranks = sort_ranks(level_ranks(view, nav, level, {r: f.host for r, f in figures.items()}),
                                   figures, sort)
                rows, cursor, cursor_key, first, total = window_rows(
                    nav, visible_rows, ranks,
                    lambda shown: self._rank_rows(view, [view.ranks[r] for r in shown], replay, outlying))
            caption = table_caption(level, nodes=len({f.host for f in figures.values()}), ranks=n, shown=len(rows),
                                    first=first, total=total, sort=sort, host=nav.host, filter_text=nav.filter)
            if not nav.scaled(n):
                strip, standouts = Text(""), Text("")
        kinds = view.comm_kinds
        if kinds != self._kinds:  # the per-kind column only widens (a rebuild), so it does not flicker
            self._kinds, self._kinds_width = kinds, 0
        if node_cols is None:
            self._kinds_width = max([self._kinds_width] + [len(cells["comm_kinds"].plain) for _, cells in rows])
        columns = node_cols or overview_columns(kinds, self._kinds_width, width,
                                                peak_known=view.facts.peak_tflops > 0)
        legend = breakdown_legend(self._run_held.get(now, (n, view.facts.strategy), None,
                                                     not replay and nav.scaled(n), lambda: run_parts(view)))
        return OverviewModel(health_line(view, now), tuple(columns), tuple(rows), legend, self._charts(view),
                             alert_text(view), banner_text(view, replay=replay), caption=caption, strip=strip,
                             standouts=standouts, cursor=cursor, cursor_key=cursor_key)

    def _charts(self, view: RunView) -> tuple[ChartModel, ...]:
        steps = view.steps
        span = (steps[0].step, steps[-1].step) if steps else None
        window, series, ref = self.comm.data(view, None)
        busbw = chart_model("busbw", "GB/s", series, None, fmt.gbps)
        return (
            chart_model("step time (max of ranks)", "ms", view.step_ms_max_history, span, fmt.ms),
            chart_model("loss (mean of ranks)", "", view.loss_history, span, fmt.loss),
            chart_model("grad norm (global, before clipping)", "", view.grad_norm_history, span, fmt.loss,
                        missing=grad_norm_missing(view)),
            ChartModel(overview_comm_label(window, ref), busbw.data, busbw.top, busbw.bottom),
        )

    def _aggregates(self, view: RunView, now: float, width: int, strip_lines: int, replay: bool) -> tuple:
        """(figures, outliers, node summaries, heat strip, standouts): O(ranks) each, so above
        AGGREGATE_ABOVE ranks a live run recomputes them once per AGGREGATE_EVERY_S (a node's
        median needs no 4 Hz), and at once when the ranks, the screen or a hang changed."""
        n = len(view.ranks)
        return self._held.get(now, (n, width, strip_lines, view.versions["hang"], replay), None,
                              not replay and n > AGGREGATE_ABOVE, lambda: self._figures(view, width, strip_lines))

    @staticmethod
    def _figures(view: RunView, width: int, strip_lines: int) -> tuple:
        figures = rank_figures(view)
        found = rank_outliers(figures)
        return (figures, found, node_summaries(figures), heat_strip(figures, width, max_lines=strip_lines),
                standouts_text(figures, found, width))

    def _rank_rows(self, view: RunView, rows: list[RankRow], replay: bool,
                   outlying: dict[str, frozenset[int]]) -> list[tuple[str, dict]]:
        """Each rank's cells, rebuilt only when its row moved on (a message, its silence, being the
        slowest) or what it is compared with did (the outliers, the collective kinds)."""
        kinds = tuple(view.comm_kinds)
        excess = view.slowest_excess_pct
        marks = rank_marks(view)
        out = []
        for row in rows:
            quiet = row.dead or (not replay and not row.ended and row.silent_s > view.stale_after_s)
            mark = marks.get(row.rank)
            key = (id(row), row.version, row.dead, row.ended, fmt.ago(row.silent_s) if quiet else "",
                   quiet and row.host in view.cut_off_hosts, row.slowest and f"{excess:.0f}",
                   tuple(row.rank in ranks for ranks in outlying.values()),
                   tuple(outlying), kinds, replay, mark)
            hit = self._cells.get(row.rank)
            if hit is None or hit[0] != key:
                hit = self._cells[row.rank] = (key, row_cells(view, row, replay, outlying, mark))
            out.append((f"r{row.rank}", hit[1]))
        return out
