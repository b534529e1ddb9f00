"""Turn the view model into each panel's immutable model (widgets/), recomputing what is costly
only when its inputs changed: the comm window and chart by the view's comm version, the fit table
by the cost model's inputs, the pipeline drawing by its version and width, event lines by count,
the Hang view's rows by the hang and ranks versions and the width."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from ringtop.metrics import fmt

from .comm import busbw_series, comm_window, peak_ref, slowest_rank
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
from .memory_tab import fit_caption, fit_columns, fit_rows, memory_caption, memory_columns, memory_rows, on_gpu
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
from .view_model import RunView
from .widgets import CommModel, EventsModel, HangModel, MemoryModel, OverviewModel, PipelineModel
from .widgets.overview import ChartModel


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

    def overview(self, view: RunView, now: float, *, replay: bool, table_width: int = 0) -> OverviewModel:
        outlying = outlying_cells(view)
        rows = [(f"r{row.rank}", row_cells(view, row, replay, outlying)) for row in view.rows()]
        kinds = view.comm_kinds
        if kinds != self._kinds:  # the per-kind column only widens (a rebuild), so it does not flicker
            self._kinds, self._kinds_width = kinds, 0
        self._kinds_width = max([self._kinds_width] + [len(cells["comm_kinds"].plain) for _, cells in rows])
        columns = overview_columns(kinds, self._kinds_width, table_width or DEFAULT_TABLE_WIDTH)
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
                             banner_text(view, replay=replay))

    def memory(self, view: RunView, table_width: int = 0) -> MemoryModel:
        f = view.facts
        key = (f.param_count, f.world_size, len(view.ranks), f.dtype, f.optimizer_bytes_per_param, f.strategy,
               tuple(sorted(f.strategy_options.items(), key=str)), f.backend, f.device, f.device_mem_total_bytes,
               max((r.mem_peak_other_bytes for r in view.ranks.values()), default=0) >> 20,
               tuple(sorted({(r.host, r.device_mem_total_bytes) for r in view.ranks.values()})))
        if key != self._fit_key:  # the cost model only reruns when its inputs change
            self._fit_key = key
            ft = fit_table(view)
            self._fit = (fit_caption(ft, view), tuple(fit_rows(ft)))
        return MemoryModel(memory_caption(view), tuple(memory_columns(on_gpu(view), table_width)),
                           tuple(memory_rows(view)), self._fit[0], tuple(fit_columns(table_width)), self._fit[1])

    def comm_tab(self, view: RunView, rank: int | None, table_width: int = 0) -> CommModel:
        window, series, ref = self.comm.data(view, rank)
        slow = self.comm.slowest(view)
        return CommModel(comm_caption(view, window, rank, slowest=slow), tuple(kinds_columns(table_width)),
                         tuple(kinds_rows(window)), busbw_label(window, ref), tuple(series), exposed_text(window),
                         tuple(ranks_columns(table_width)), tuple(ranks_rows(view, rank, slowest=slow)),
                         verdict_panel(view, slowest=slow))

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
