"""The Pipeline tab's panel: the run's state in, `PipelineModel` out. The timeline drawing depends
on the width, so it is cached on the pipeline's version and the width."""

from __future__ import annotations

from rich.text import Text

from ringtop.tui.panel import Built, Frame
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tabs.pipeline.figures import idle_rows
from ringtop.tui.tabs.pipeline.model import PipelineModel
from ringtop.tui.tabs.pipeline.render import (
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
from ringtop.tui.tabs.pipeline.widget import PipelinePanel


class PipelineTab:
    tab = "pipeline"
    widget = PipelinePanel

    def __init__(self) -> None:
        self._timeline_key: tuple | None = None
        self._timeline = Text("")

    def build(self, frame: Frame, widget: PipelinePanel) -> Built:
        return Built(self.model(frame.view, widget.timeline_width or (frame.screen_width - 2)))

    def model(self, view: RunView, width: int) -> PipelineModel:
        ps = view.pipeline
        p = ps.latest
        pipeline = is_pipeline(view)
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
