"""The Memory tab's panel: the run's state in, `MemoryModel` out. A small run: two rows per rank.
More than SCALE_ABOVE ranks: the level the nav is at (nodes, a node's ranks, the filtered ranks),
only its rows on screen built. The fit table reruns the cost model only when its inputs change."""

from __future__ import annotations

from rich.text import Text

from ringtop.tui.large_run.nav import OverviewNav, memory_nav
from ringtop.tui.large_run.spreads import table_caption
from ringtop.tui.large_run.tables import AGGREGATE_ABOVE, Held, level_ranks, marked_cells, window_rows
from ringtop.tui.panel import Built, Frame
from ringtop.tui.state.marks import rank_marks, troubled_first
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import DEFAULT_TABLE_WIDTH
from ringtop.tui.tabs.memory.figures import fit_table
from ringtop.tui.tabs.memory.model import MemoryModel
from ringtop.tui.tabs.memory.render import (
    bar_scale,
    fit_caption,
    fit_columns,
    fit_rows,
    memory_caption,
    memory_columns,
    memory_rows,
    on_gpu,
)
from ringtop.tui.tabs.memory.scale import (
    memory_figures,
    memory_nodes,
    memory_standouts,
    most_memory,
    node_cells,
    node_columns,
    sort_memory_nodes,
    sort_memory_ranks,
)
from ringtop.tui.tabs.memory.widget import MemoryPanel


class MemoryTab:
    tab = "memory"
    widget = MemoryPanel

    def __init__(self) -> None:
        self._fit_key: tuple | None = None
        self._fit: tuple[Text, tuple] = (Text(""), ())
        self._held = Held()

    def build(self, frame: Frame, widget: MemoryPanel) -> Built:
        rows = widget.table_rows(widget.TABLE_SHARE)
        model = self.model(frame.view, widget.table_width, nav=frame.navs[self.tab], visible_rows=rows,
                           now=frame.now, replay=frame.replay)
        return Built(model, model.cursor_key, rows)

    def _fit_table(self, view: RunView) -> tuple[Text, tuple]:
        f = view.facts
        key = (f.param_count, f.world_size, len(view.ranks), f.dtype, f.optimizer_bytes_per_param, f.strategy,
               tuple(sorted(f.strategy_options.items(), key=str)), f.backend, f.device, f.device_mem_total_bytes,
               max((r.mem_peak_other_bytes for r in view.ranks.values()), default=0) >> 20,
               tuple(sorted({(r.host, r.device_mem_total_bytes) for r in view.ranks.values()})))
        if key != self._fit_key:  # the cost model only reruns when its inputs change
            self._fit_key = key
            ft = fit_table(view)
            self._fit = (fit_caption(ft, view), tuple(fit_rows(ft)))
        return self._fit

    def model(self, view: RunView, table_width: int = 0, *, nav: OverviewNav | None = None, visible_rows: int = 0,
              now: float = 0.0, replay: bool = True) -> MemoryModel:
        fit_cap, fit_body = self._fit_table(view)
        nav, n, gpu = nav or memory_nav(), len(view.ranks), on_gpu(view)
        fit = (fit_cap, tuple(fit_columns(table_width)), fit_body)
        if not (nav.scaled(n) or nav.filter or nav.sort is not None):
            return MemoryModel(memory_caption(view), tuple(memory_columns(gpu, table_width)),
                               tuple(memory_rows(view)), *fit)
        width = table_width or DEFAULT_TABLE_WIDTH

        def figures() -> tuple:
            got = memory_figures(view)
            return got, memory_nodes(got), memory_standouts(got, width), most_memory(got), bar_scale(view), \
                memory_caption(view)
        figs, nodes, standouts, most, scale, caption = self._held.get(
            now, (n, width, gpu, replay), view.versions["ranks"], not replay and n > AGGREGATE_ABOVE, figures)
        level, sort = nav.level(n), nav.sort_key(n)
        marks = rank_marks(view)
        if level == "nodes":
            columns = node_columns(gpu, width)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, troubled_first(sort_memory_nodes(nodes, sort), lambda x: x.ranks, marks,
                                                  lambda x: x.dead),
                lambda shown: [(f"n{node.host}", marked_cells(node_cells(node, most), node.ranks, marks))
                               for node in shown])
        else:
            columns = memory_columns(gpu, table_width)
            ranks = troubled_first(
                sort_memory_ranks(level_ranks(view, nav, level, {r: x.host for r, x in figs.items()}), figs, sort),
                lambda r: (r,), marks, lambda r: figs[r].dead)
            rows, cursor, cursor_key, first, total = window_rows(
                nav, visible_rows, ranks,
                lambda shown: memory_rows(view, [view.ranks[r] for r in shown], pred_rows=False, scale=scale))
        table_cap = table_caption(level, nodes=len(nodes), ranks=n, shown=len(rows), first=first, total=total,
                                  sort=sort, host=nav.host, filter_text=nav.filter)
        return MemoryModel(caption, tuple(columns), tuple(rows), *fit, table_caption=table_cap,
                           standouts=standouts if nav.scaled(n) else Text(""), cursor=cursor, cursor_key=cursor_key)
