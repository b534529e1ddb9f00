"""Turn the view model into each panel's immutable model (widgets/), recomputing what is costly
only when its inputs changed: the comm window and chart by the view's comm version, the fit table
by the cost model's inputs, the pipeline drawing by its version and width, event lines by count,
the Hang view's rows by the hang and ranks versions and the width."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from ringtop.metrics import fmt

from .comm import busbw_series, comm_window, peak_ref, slowest_rank
from .comm_scale import comm_nodes, comm_standouts, compute_times, rank_comm, sort_comm_nodes, sort_comm_ranks
from .comm_scale import node_cells as comm_node_cells
from .comm_scale import node_columns as comm_node_columns
from .comm_tab import (
    busbw_label,
    comm_caption,
    exposed_text,
    kinds_columns,
    kinds_rows,
    overview_comm_label,
    ranks_columns,
    ranks_rows,
    verdict_panel,
)
from .events_tab import event_line, operations_text
from .hang_tab import GROUP_ABOVE, banner_text, hang_caption, hang_columns, hang_rows, rank_states, stacks_reply_text
from .hang_tab import stack_text as hang_stack_text
from .health import health_line
from .memory import fit_table
from .memory_scale import (
    memory_figures,
    memory_nodes,
    memory_standouts,
    most_memory,
    sort_memory_nodes,
    sort_memory_ranks,
)
from .memory_scale import node_cells as memory_node_cells
from .memory_scale import node_columns as memory_node_columns
from .memory_tab import (
    bar_scale,
    fit_caption,
    fit_columns,
    fit_rows,
    memory_caption,
    memory_columns,
    memory_rows,
    on_gpu,
)
from .nodes import by_host, filter_ranks, node_summaries, nodes_cut_off, rank_figures, sort_nodes, sort_ranks
from .overview_nav import OverviewNav, comm_nav, memory_nav
from .overview_scale import (
    STRIP_MAX_LINES,
    heat_strip,
    hosts_caption,
    node_cells,
    node_columns,
    rank_outliers,
    standouts_text,
    table_caption,
)
from .overview_tab import (
    DEFAULT_TABLE_WIDTH,
    alert_text,
    breakdown_legend,
    chart_model,
    outlying_cells,
    overview_columns,
    row_cells,
)
from .pipeline import idle_rows
from .pipeline_tab import (
    HISTORY_COLUMNS,
    STAGE_COLUMNS,
    bubble_text,
    caption_text,
    history_caption,
    history_rows,
    idle_text,
    is_pipeline,
    legend_text,
    stage_rows,
    timeline_text,
)
from .view_model import RankRow, RunView
from .widgets import CommModel, EventsModel, HangModel, MemoryModel, OverviewModel, PipelineModel
from .widgets.overview import ChartModel

AGGREGATE_ABOVE = 256
AGGREGATE_EVERY_S = 1.0
"""A live run above AGGREGATE_ABOVE ranks: its node rows, heat strip and outliers at most this often."""


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


class CommFigures:
    """(window, busbw series, peak reference) per selection, and the slowest rank, computed once
    per change of the view's communication figures."""

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


class Builders:
    """One per app: the panel models, each built only for the panel on screen."""

    def __init__(self) -> None:
        self.comm = CommFigures()
        self._kinds: list[str] = []
        self._kinds_width = 0
        self._fit_key: tuple | None = None
        self._fit: tuple[Text, tuple] = (Text(""), ())
        self._timeline_key: tuple | None = None
        self._timeline = Text("")
        self._events_key: tuple | None = None
        self._event_lines: tuple = ()
        self._hang_key: tuple | None = None
        self._hang: tuple = ((), ())
        self._held: dict[str, tuple] = {}
        """Per table, (shape, version, when, what its large run's figures were)."""
        self._cells: dict[int, tuple[tuple, dict[str, Text]]] = {}
        """Per rank, (what its cells were built from, the cells)."""

    def overview(self, view: RunView, now: float, *, replay: bool, table_width: int = 0,
                 nav: OverviewNav | None = None, visible_rows: int = 0, strip_lines: int = STRIP_MAX_LINES
                 ) -> OverviewModel:
        """The Overview. A small run: one row per rank, as always. More than SCALE_ABOVE ranks (or a
        filter or sort chosen): the level `nav` is at (nodes, a node's ranks, the filtered ranks),
        only its `visible_rows` on screen built, with the heat strip and the standouts."""
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
                rows, cursor, cursor_key, first, total = window_rows(
                    nav, visible_rows, sort_nodes(summaries, sort),
                    lambda shown: [(f"n{node.host}", node_cells(node, view.slowest_rank)) for node in shown])
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
        steps = view.steps
        span = (steps[0].step, steps[-1].step) if steps else None
        window, series, ref = self.comm.data(view, None)
        busbw = chart_model("busbw", "GB/s", series, None, fmt.gbps)
        charts = (
            chart_model("step time (max of ranks)", "ms", view.step_ms_max_history, span, fmt.ms),
            chart_model("loss (mean of ranks)", "", view.loss_history, span, fmt.loss),
            chart_model("grad norm (global, before clipping)", "", view.grad_norm_history, span, fmt.loss),
            ChartModel(overview_comm_label(window, ref), busbw.data, busbw.top, busbw.bottom),
        )
        legend = breakdown_legend() if any(c.key == "breakdown" for c in columns) else Text("")
        return OverviewModel(health_line(view, now), tuple(columns), tuple(rows), legend, charts, alert_text(view),
                             banner_text(view, replay=replay), caption=caption, strip=strip, standouts=standouts,
                             cursor=cursor, cursor_key=cursor_key)

    def _aggregates(self, view: RunView, now: float, width: int, strip_lines: int, replay: bool) -> tuple:
        """(figures, outliers, node summaries, heat strip, standouts): O(ranks) each, so above
        AGGREGATE_ABOVE ranks a live run recomputes them once per AGGREGATE_EVERY_S (a node's
        median needs no 4 Hz), and at once when the ranks, the screen or a hang changed."""
        n = len(view.ranks)
        return self._hold("overview", now, (n, width, strip_lines, view.versions["hang"], replay), None,
                          not replay and n > AGGREGATE_ABOVE, lambda: self._overview_figures(view, width, strip_lines))

    @staticmethod
    def _overview_figures(view: RunView, width: int, strip_lines: int) -> tuple:
        figures = rank_figures(view)
        found = rank_outliers(figures)
        return (figures, found, node_summaries(figures), heat_strip(figures, width, max_lines=strip_lines),
                standouts_text(figures, found, width))

    def _hold(self, name: str, now: float, shape: tuple, version: object, throttle: bool, compute) -> Any:
        """A large table's figures, recomputed when its shape (ranks, width, …) or the view's
        `version` of them moved on (None: always), but while `throttle` at most once per
        AGGREGATE_EVERY_S: they are O(ranks), and a node's median needs no 4 Hz."""
        held = self._held.get(name)
        if held is not None and held[0] == shape and (
                (version is not None and held[1] == version) or (throttle and 0 <= now - held[2] < AGGREGATE_EVERY_S)):
            return held[3]
        value = compute()
        self._held[name] = (shape, version, now, value)
        return value

    def _rank_rows(self, view: RunView, rows: list[RankRow], replay: bool,
                   outlying: dict[str, frozenset[int]]) -> list[tuple[str, dict]]:
        """Each rank's cells, rebuilt only when its row moved on (a message, its silence, being the
        slowest) or what it is compared with did (the outliers, the collective kinds)."""
        kinds = tuple(view.comm_kinds)
        excess = view.slowest_excess_pct
        out = []
        for row in rows:
            quiet = row.dead or (not replay and not row.ended and row.silent_s > view.stale_after_s)
            key = (id(row), row.version, row.dead, row.ended, fmt.ago(row.silent_s) if quiet else "",
                   quiet and row.host in view.cut_off_hosts, row.slowest and f"{excess:.0f}",
                   tuple(row.rank in ranks for ranks in outlying.values()),
                   tuple(outlying), kinds, replay)
            hit = self._cells.get(row.rank)
            if hit is None or hit[0] != key:
                hit = self._cells[row.rank] = (key, row_cells(view, row, replay, outlying))
            out.append((f"r{row.rank}", hit[1]))
        return out

    def memory(self, view: RunView, table_width: int = 0, *, nav: OverviewNav | None = None, visible_rows: int = 0,
               now: float = 0.0, replay: bool = True) -> MemoryModel:
        """The Memory tab. A small run: two rows per rank, as always. More than SCALE_ABOVE ranks:
        the level `nav` is at (nodes, a node's ranks, the filtered ranks), its `visible_rows` built."""
        f = view.facts
        key = (f.param_count, f.world_size, len(view.ranks), f.dtype, f.optimizer_bytes_per_param, f.strategy,
               tuple(sorted(f.strategy_options.items(), key=str)), f.backend, f.device, f.device_mem_total_bytes,
               max((r.mem_peak_other_bytes for r in view.ranks.values()), default=0) >> 20,
               tuple(sorted({(r.host, r.device_mem_total_bytes) for r in view.ranks.values()})))
        if key != self._fit_key:  # the cost model only reruns when its inputs change
            self._fit_key = key
            ft = fit_table(view)
            self._fit = (fit_caption(ft, view), tuple(fit_rows(ft)))
        nav, n, gpu = nav or memory_nav(), len(view.ranks), on_gpu(view)
        fit = (self._fit[0], tuple(fit_columns(table_width)), self._fit[1])
        if not (nav.scaled(n) or nav.filter or nav.sort is not None):
            return MemoryModel(memory_caption(view), tuple(memory_columns(gpu, table_width)),
                               tuple(memory_rows(view)), *fit)
        width = table_width or DEFAULT_TABLE_WIDTH

        def figures() -> tuple:
            got = memory_figures(view)
            return got, memory_nodes(got), memory_standouts(got, width), most_memory(got), bar_scale(view), \
                memory_caption(view)
        figs, nodes, standouts, most, scale, caption = self._hold(
            "memory", now, (n, width, gpu, replay), view.versions["ranks"], not replay and n > AGGREGATE_ABOVE, figures)
        level, sort = nav.level(n), nav.sort_key(n)
        if level == "nodes":
            columns = memory_node_columns(gpu, width)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, sort_memory_nodes(nodes, sort),
                lambda shown: [(f"n{node.host}", memory_node_cells(node, most)) for node in shown])
        else:
            columns = memory_columns(gpu, table_width)
            ranks = sort_memory_ranks(level_ranks(view, nav, level, {r: x.host for r, x in figs.items()}), figs, sort)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, ranks,
                lambda shown: memory_rows(view, [view.ranks[r] for r in shown], pred_rows=False, scale=scale))
        table_cap = table_caption(level, nodes=len(nodes), ranks=n, shown=len(rows), first=first, total=total,
                                  sort=sort, host=nav.host, filter_text=nav.filter)
        return MemoryModel(caption, tuple(columns), tuple(rows), *fit, table_caption=table_cap,
                           standouts=standouts if nav.scaled(n) else Text(""), cursor=cursor, cursor_key=cursor_key)

    def comm_tab(self, view: RunView, rank: int | None, table_width: int = 0, *, nav: OverviewNav | None = None,
                 visible_rows: int = 0, now: float = 0.0, replay: bool = True) -> CommModel:
        """The Comm tab. A small run: one row per rank, as always. More than SCALE_ABOVE ranks: one
        row per node (or a node's ranks, the filtered ranks), each rank's window read once."""
        window, series, ref = self.comm.data(view, rank)
        nav, n = nav or comm_nav(), len(view.ranks)
        if not (nav.scaled(n) or nav.filter or nav.sort is not None):
            slow = self.comm.slowest(view)
            return CommModel(comm_caption(view, window, rank, slowest=slow), tuple(kinds_columns(table_width, window)),
                             tuple(kinds_rows(window)), busbw_label(window, ref), tuple(series),
                             exposed_text(window), tuple(ranks_columns(table_width)),
                             tuple(ranks_rows(view, rank, slowest=slow)), verdict_panel(view, slowest=slow))
        width = table_width or DEFAULT_TABLE_WIDTH

        def figures() -> tuple:
            held = self._held.get("comm")
            got = rank_comm(view, previous=held[3][0] if held is not None else None)
            return got, comm_nodes(got), comm_standouts(got, width), slowest_rank(view, compute=compute_times(got))
        figs, nodes, standouts, slow = self._hold("comm", now, (n, width, replay), view.comm_version,
                                                  not replay and n > AGGREGATE_ABOVE, figures)
        level, sort = nav.level(n), nav.sort_key(n)
        slow_rank = slow.rank if slow is not None else None
        if level == "nodes":
            columns = comm_node_columns(width)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, sort_comm_nodes(nodes, sort),
                lambda shown: [(f"n{node.host}", comm_node_cells(node, slow_rank)) for node in shown])
        else:
            columns = ranks_columns(table_width)
            ranks = sort_comm_ranks(level_ranks(view, nav, level, {r: x.host for r, x in figs.items()}), figs, sort)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, ranks,
                lambda shown: ranks_rows(view, rank, slowest=slow, rows=[view.ranks[r] for r in shown]))
        table_cap = table_caption(level, nodes=len(nodes), ranks=n, shown=len(rows), first=first, total=total,
                                  sort=sort, host=nav.host, filter_text=nav.filter)
        return CommModel(comm_caption(view, window, rank, slowest=slow), tuple(kinds_columns(table_width, window)),
                         tuple(kinds_rows(window)), busbw_label(window, ref), tuple(series), exposed_text(window),
                         tuple(columns), tuple(rows), verdict_panel(view, slowest=slow), table_caption=table_cap,
                         standouts=standouts if nav.scaled(n) else Text(""), cursor=cursor, cursor_key=cursor_key)

    def pipeline(self, view: RunView, width: int) -> PipelineModel:
        ps = view.pipeline
        p = ps.latest
        pipeline = is_pipeline(view)
        # the drawing depends on the width, so it is cached on it too
        key = (pipeline, p is not None, ps.version, width, view.messages_total if not pipeline or p is None else 0)
        if key != self._timeline_key:
            self._timeline_key = key
            if pipeline and p is not None:
                self._timeline = timeline_text(p, width)
            else:  # idle per rank; and when the run was a pipeline earlier (a switch), its last step below
                self._timeline = idle_text(idle_rows(view.rows()), width)
                if not pipeline and p is not None:
                    self._timeline.append(f"\n\nthe last pipeline step seen, step {p.step:,} "
                                          f"({p.schedule or '?'}, N={p.stages}, M={p.micro_batches}):\n",
                                          style="bold")
                    self._timeline.append_text(timeline_text(p, width))
        if p is None:
            return PipelineModel(caption_text(view), self._timeline, detail=False)
        return PipelineModel(caption_text(view), self._timeline, detail=True, legend=legend_text(),
                             bubble=bubble_text(p), stage_columns=tuple(STAGE_COLUMNS),
                             stage_rows=tuple(stage_rows(p)), history_caption=history_caption(ps),
                             history_columns=tuple(HISTORY_COLUMNS), history_rows=tuple(history_rows(ps)))

    def hang(self, view: RunView, selected: int | None, table_width: int = 0, *, replay: bool) -> HangModel:
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
                         hang_stack_text(view, selected), stacks_reply_text(view))

    def events(self, view: RunView, *, replay: bool) -> EventsModel:
        key = (view.events_total, len(view.events))
        if key != self._events_key:
            self._events_key = key
            held = sorted(view.events, key=lambda e: (e.ts, e.seq))
            self._event_lines = tuple((e.seq, event_line(e)) for e in held)
        first = min((seq for seq, _ in self._event_lines), default=view.events_total)
        return EventsModel(operations_text(view, replay=replay), self._event_lines, not_kept=first)
