"""The Pipeline tab's renderings (Rich text and table rows) from tui/state/pipeline.py and figures.py.

The timeline is drawn like the chapter's diagram: one row per stage, a block per forward ("F1",
cyan) and backward ("B1", magenta) of each micro-batch (numbered from 1, as the chapter does),
placed by time across the width; idle time inside the stage's window is a dim dot. Under the
measured rows, dimmer, the same schedule replayed with the measured times (the prediction).
"""

from __future__ import annotations

import math

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.tui.state.pipeline import BubbleSegment, PipelineState, PipelineStep
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import Column
from ringtop.tui.tabs.pipeline.figures import Cell, IdleRow, draw_row, fraction_text, replay_spans

LABEL_WIDTH = 10
RIGHT_WIDTH = 14
STYLES = {
    ("F", 0): "bold black on cyan",
    ("F", 1): "black on dark_cyan",
    ("B", 0): "bold black on magenta",
    ("B", 1): "black on dark_magenta",
}
REPLAY_STYLES = {"F": "cyan", "B": "magenta"}


def is_pipeline(view: RunView) -> bool:
    """A pipeline run: the strategy says so, or timelines arrive."""
    strategy = view.facts.strategy
    return strategy == "pp" or (not strategy and view.pipeline.seen)


def bar_width(width: int) -> int:
    return max(10, width - LABEL_WIDTH - RIGHT_WIDTH - 2)


def _cells_text(cells: list[Cell], replay: bool) -> Text:
    t = Text(no_wrap=True, overflow="crop")
    for c in cells:
        if c.kind in ("F", "B"):
            style = REPLAY_STYLES[c.kind] if replay else STYLES[(c.kind, c.micro_batch % 2)]
            t.append(c.label if not replay or c.label.strip() else "▬", style=style)
        elif c.kind == "idle":
            t.append("·", style="dim")
        else:
            t.append(" ")
    return t


def timeline_text(p: PipelineStep, width: int, show_replay: bool = True) -> Text:
    """The stage rows of one step (and the replay's rows), with a time axis."""
    bar = bar_width(width)
    span = p.span_ms or 1.0
    t = Text(no_wrap=True, overflow="crop")
    for line in p.lines:
        t.append(f"stage {line.stage}".ljust(LABEL_WIDTH), style="bold")
        t.append("│", style="dim")
        t.append_text(_cells_text(draw_row(line.spans, line.window_ms, span, bar, line.offset_ms), replay=False))
        t.append("│", style="dim")
        t.append(f" idle {fmt.fraction_pct(line.bubble):>6}".ljust(RIGHT_WIDTH),
                 style="bold yellow" if line is p.worst else "")
        t.append("\n")
    if show_replay and p.replay is not None:
        for line in p.lines:
            t.append(f" replay {line.stage}".ljust(LABEL_WIDTH), style="dim")
            t.append("│", style="dim")
            cells = draw_row(replay_spans(p.replay, line.stage), p.replay.makespan_ms, span, bar, p.replay_offset_ms)
            t.append_text(_cells_text(cells, replay=True))
            t.append("│", style="dim")
            t.append(f" idle {fmt.fraction_pct(p.replay_bubble(line.stage)):>6}".ljust(RIGHT_WIDTH), style="dim")
            t.append("\n")
    axis_end = f"{fmt.ms(span)} ms"
    t.append(" " * (LABEL_WIDTH + 1) + "0", style="dim")
    t.append(axis_end.rjust(bar - 1), style="dim")
    return t


def legend_text() -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("F1", style=STYLES[("F", 0)])
    t.append(" forward of micro-batch 1  ")
    t.append("B1", style=STYLES[("B", 0)])
    t.append(" backward  ")
    t.append("·", style="dim")
    t.append(" idle (bubble)  ")
    t.append("replay", style="dim")
    t.append(" = the schedule replayed with these measured times (the prediction)", style="dim")
    return t


def caption_text(view: RunView) -> Text:
    ps = view.pipeline
    p = ps.latest
    t = Text(no_wrap=False)
    if not is_pipeline(view):
        t.append("Not a pipeline run" + (" now" if ps.seen else ""), style="bold")
        strategy = view.facts.strategy_name or "unknown"
        t.append(f" (strategy {strategy}): no stage timelines. Idle per rank below is the time a "
                 "rank waited on input or on exposed communication rather than computing.", style="dim")
        if ps.latest is not None:
            t.append(f" The run was a pipeline until step {ps.latest.step:,} or later: its last sampled step "
                     "is below.", style="dim")
        return t
    if p is None:
        t.append("Pipeline", style="bold")
        if ps.last_stages:
            t.append(f"  {ps.last_schedule or '?'}  N={ps.last_stages} stages × "
                     f"M={ps.last_micro_batches} micro-batches")
        t.append(f"  waiting for the timelines of every stage of one step ({ps.timelines_total} timelines so far; "
                 "ranks send them for a sample of the steps)", style="dim")
        return t
    t.append("Pipeline", style="bold")
    t.append(f"  {p.schedule or '?'}", style="bold magenta")
    t.append(f"  N={p.stages} stages × M={p.micro_batches} micro-batches")
    t.append(f"   step {p.step:,}", style="bold")
    windows = [line.window_ms for line in p.lines]
    t.append(f"   window {fmt.ms(max(windows))} ms", style="dim")
    ranks = ", ".join(f"s{line.stage}=r{line.rank}" for line in p.lines)
    t.append(f"  {ranks}, {ps.steps_total} sampled, ", style="dim")
    t.append("aligned on the host clock" if p.aligned else "each stage from its own window start", style="dim")
    return t


def bubble_text(p: PipelineStep) -> Text:
    """Measured beside replay beside theory, and what the idle time is made of."""
    t = Text(no_wrap=False)
    t.append("bubble  ", style="bold")
    t.append("measured ", style="dim")
    t.append(fmt.fraction_pct(p.measured), style="bold yellow")
    worst = p.worst
    t.append(f" (1 − Σbusy/Σwindow; worst stage {worst.stage}: {fmt.fraction_pct(worst.bubble)})", style="dim")
    t.append("   replay ", style="dim")
    t.append(fmt.fraction_pct(p.predicted), style="bold")
    t.append("   theory ", style="dim")
    t.append(fmt.fraction_pct(p.theory), style="bold cyan")
    t.append(f" = (N−1)/(N+M−1) = {fraction_text(p.stages, p.micro_batches)}", style="dim")
    b = p.breakdown
    t.append("\n")
    if b is None:
        t.append("why     ", style="bold")
        t.append(f"no replay for this step: {p.replay_error or 'unknown'}", style="dim")
        return t
    t.append("why     ", style="bold")
    parts = [("schedule", fmt.fraction_pct(b.from_schedule)),
             ("imbalance", fmt.signed_fraction_pct(b.from_imbalance)),
             ("transfers", fmt.signed_fraction_pct(b.from_transfers)),
             ("overhead", fmt.signed_fraction_pct(b.from_overhead)),
             ("unexplained", fmt.signed_fraction_pct(b.unexplained))]
    for i, (name, value) in enumerate(parts):
        if i:
            t.append("  + ", style="dim")
        t.append(f"{name} ")
        t.append(value, style="bold")
    t.append("  = measured ", style="dim")
    t.append(fmt.fraction_pct(b.measured), style="bold yellow")
    t.append("\n")
    t.append(f"        schedule: equal stages, free p2p · imbalance: each op's own time · transfers: "
             f"{fmt.num(b.p2p_ms, 2)} ms/hand-off · overhead: {fmt.num(b.overhead_ms, 2)} ms/op", style="dim")
    return t


STAGE_COLUMNS = [
    Column("stage", "stage", 5), Column("rank", "rank", 4, True),
    Column("fwd", "fwd ms/mb", 9, True), Column("bwd", "bwd ms/mb", 9, True),
    Column("busy", "busy ms", 8, True), Column("wait", "wait recv", 9, True),
    Column("idle", "idle ms", 8, True), Column("window", "window", 8, True),
    Column("bubble", "bubble", 7, True), Column("replay", "replay", 7, True), Column("theory", "theory", 7, True),
]


def stage_rows(p: PipelineStep | None) -> list[tuple[str, dict[str, Text]]]:
    if p is None:
        return []
    rows = []
    worst = p.worst.stage
    for line in p.lines:
        f_ops = sum(1 for s in line.spans if s.op == "F")
        b_ops = sum(1 for s in line.spans if s.op == "B")
        rows.append((f"s{line.stage}", {
            "stage": Text(str(line.stage), style="bold"),
            "rank": Text(str(line.rank)),
            "fwd": Text(fmt.ms(line.forward_ms / f_ops) if f_ops else "-"),
            "bwd": Text(fmt.ms(line.backward_ms / b_ops) if b_ops else "-"),
            "busy": Text(fmt.ms(line.busy_ms)),
            "wait": Text(fmt.ms(line.wait_recv_ms)),
            "idle": Text(fmt.ms(line.idle_ms)),
            "window": Text(fmt.ms(line.window_ms)),
            "bubble": Text(fmt.fraction_pct(line.bubble), style="bold yellow" if line.stage == worst else ""),
            "replay": Text(fmt.fraction_pct(p.replay_bubble(line.stage))),
            "theory": Text(fmt.fraction_pct(p.theory), style="cyan"),
        }))
    rows.append(("all", {
        "stage": Text("all", style="bold"), "rank": Text(""),
        "busy": Text(fmt.ms(sum(line.busy_ms for line in p.lines))),
        "wait": Text(fmt.ms(sum(line.wait_recv_ms for line in p.lines))),
        "idle": Text(fmt.ms(sum(line.idle_ms for line in p.lines))),
        "window": Text(fmt.ms(sum(line.window_ms for line in p.lines))),
        "bubble": Text(fmt.fraction_pct(p.measured), style="bold"),
        "replay": Text(fmt.fraction_pct(p.predicted), style="bold"),
        "theory": Text(fmt.fraction_pct(p.theory), style="bold cyan"),
    }))
    return rows


HISTORY_COLUMNS = [
    Column("m", "M", 4, True), Column("schedule", "schedule", 8), Column("n", "N", 3, True),
    Column("steps", "steps", 13, True), Column("samples", "samples", 7, True),
    Column("measured", "measured", 8, True), Column("replay", "replay", 7, True),
    Column("theory", "theory", 7, True), Column("bar", "measured ▏ theory", 26),
]
HISTORY_BAR = 24


def history_bar(measured: float, theory: float, width: int = HISTORY_BAR) -> Text:
    """A bar of the measured bubble (0..100 % over `width` cells) with the theory marked by ▏."""
    t = Text(no_wrap=True)
    filled = round(width * measured) if math.isfinite(measured) else 0
    mark = min(width - 1, round(width * theory)) if math.isfinite(theory) else -1
    for i in range(width):
        ch = "█" if i < filled else " "
        if i == mark:
            t.append("▏" if ch == " " else "▌", style="bold cyan")
        else:
            t.append(ch, style="yellow")
    return t


def history_rows(ps: PipelineState) -> list[tuple[str, dict[str, Text]]]:
    rows = []
    latest = ps.history[-1] if ps.history else None
    for i, seg in enumerate(ps.history):
        seg: BubbleSegment
        steps = f"{seg.first_step:,}–{seg.last_step:,}" if seg.last_step != seg.first_step else f"{seg.first_step:,}"
        now = seg is latest
        rows.append((f"h{i}", {
            "m": Text(str(seg.micro_batches), style="bold" if now else ""),
            "schedule": Text(seg.schedule or "?"), "n": Text(str(seg.stages)),
            "steps": Text(steps), "samples": Text(str(seg.samples)),
            "measured": Text(fmt.fraction_pct(seg.measured), style="bold yellow" if now else "yellow"),
            "replay": Text(fmt.fraction_pct(seg.predicted)), "theory": Text(fmt.fraction_pct(seg.theory), style="cyan"),
            "bar": history_bar(seg.measured, seg.theory),
        }))
    return rows


def history_caption(ps: PipelineState) -> Text:
    t = Text(no_wrap=False)
    t.append("bubble vs micro-batches M", style="bold")
    t.append("  (measured: mean over the sampled steps of each stretch with the same N, M, schedule; replay: "
             "its last 4; newest last; press m to set M)", style="dim")
    return t


def idle_text(rows: list[IdleRow], width: int) -> Text:
    """Idle % per rank (not a pipeline): a bar per rank, from Step.idle_ms."""
    t = Text(no_wrap=True, overflow="crop")
    if not rows:
        t.append("no steps yet", style="dim")
        return t
    bar = max(10, min(50, width - 60))
    t.append(f"{'rank':>4}  {'idle ms':>8}  {'step ms':>8}  {'idle %':>6}  ", style="bold")
    t.append(f"{'data ms':>8}  {'exposed comm':>12}", style="bold")
    t.append("  each rank's latest step\n", style="dim")
    for r in rows:
        style = "dim" if r.ended else ""
        t.append(f"{r.rank:>4}  {fmt.ms(r.idle_ms):>8}  {fmt.ms(r.step_ms):>8}  {fmt.pct(r.idle_pct):>6}  ",
                 style=style)
        t.append(f"{fmt.ms(r.data_ms):>8}  {fmt.ms(r.exposed_comm_ms):>12}  ", style=style)
        filled = round(bar * r.idle_pct / 100) if math.isfinite(r.idle_pct) else 0
        t.append("█" * max(0, min(bar, filled)), style="yellow")
        t.append("·" * max(0, bar - filled), style="dim")
        if not r.reported:
            t.append("  (data + exposed comm: the agent sent no idle time)", style="dim")
        t.append("\n")
    t.rstrip()
    return t
