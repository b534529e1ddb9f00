"""The Pipeline tab's figures for drawing: a stage's timeline as cells, a replay's spans, the bubble
fraction written out, and each rank's idle time for runs that are not a pipeline. Pure Python (no
Textual, no Rich); the steps themselves are folded in tui/state/pipeline.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ringtop.metrics.costs.pipeline_schedule import ScheduleReplay
from ringtop.metrics.timing import idle_ms
from ringtop.protocol import StageSpan


class Cell(NamedTuple):
    """One character cell of a drawn timeline row."""

    kind: str
    """"F", "B", "idle" (inside the stage's window, nothing running) or "out" (past its window)."""
    micro_batch: int = -1
    label: str = ""
    """The block's label, one character per cell ("F1  " is F, 1, space, space); "" for idle/out."""


# ---------------------------------------------------------------------- drawing


def draw_row(spans, window_ms: float, span_ms: float, width: int, offset_ms: float = 0.0) -> list[Cell]:
    """One stage's timeline as `width` cells over [0, span_ms): each cell shows the op covering at
    least half of it, else idle (inside the window [offset, offset + window)) or nothing (outside).
    Span times are relative to `offset_ms`. Every op gets at least one cell, so a short op never
    vanishes; a block's label is written into its first cells."""
    if width <= 0:
        return []
    ops = [(sp.micro_batch, sp.op, float(sp.start_ms), float(sp.end_ms)) if isinstance(sp, StageSpan)
           else (sp[0], sp[1], float(sp[2]), float(sp[3])) for sp in spans]
    ops = [(mb, op, start + offset_ms, end + offset_ms) for mb, op, start, end in ops]
    if span_ms <= 0:
        span_ms = max((e for _, _, _, e in ops), default=0.0) or 1.0
    scale = span_ms / width
    owner: list[int] = [-1] * width
    for c in range(width):
        t0, t1 = c * scale, (c + 1) * scale
        best, best_overlap = -1, 0.0
        for i, (_, _, start, end) in enumerate(ops):
            overlap = min(end, t1) - max(start, t0)
            if overlap > best_overlap:
                best, best_overlap = i, overlap
        if best >= 0 and best_overlap >= scale / 2:
            owner[c] = best
    shown = set(owner)
    for i, (_, _, start, end) in enumerate(ops):
        if i not in shown:
            c = min(width - 1, max(0, int(((start + end) / 2) / scale)))
            if owner[c] == -1:
                owner[c] = i
    cells: list[Cell] = []
    c = 0
    while c < width:
        i = owner[c]
        run = 1
        while c + run < width and owner[c + run] == i:
            run += 1
        if i == -1:
            for k in range(run):
                mid = (c + k + 0.5) * scale
                inside = window_ms <= 0 or offset_ms <= mid < offset_ms + window_ms
                cells.append(Cell("idle" if inside else "out"))
        else:
            mb, op, _, _ = ops[i]
            label = f"{op}{mb + 1}"
            text = label[:run] if run >= len(label) else op
            text = text.ljust(run)
            for k in range(run):
                cells.append(Cell(op, mb, text[k]))
        c += run
    return cells


def replay_spans(replay: ScheduleReplay, stage: int) -> list[tuple[int, str, float, float]]:
    return [(op.micro_batch, op.kind, op.start_ms, op.end_ms) for op in replay.timeline[stage]]


def fraction_text(stages: int, micro_batches: int) -> str:
    """(N-1)/(N+M-1) written out, e.g. "1/3"."""
    return f"{stages - 1}/{stages + micro_batches - 1}"


@dataclass(frozen=True)
class IdleRow:
    """Idle time of one rank's latest step (Step.idle_ms), for runs that are not a pipeline."""

    rank: int
    idle_ms: float
    step_ms: float
    idle_pct: float
    data_ms: float
    exposed_comm_ms: float
    reported: bool
    """True when the agent sent Step.idle_ms; False: data + exposed communication, computed here."""
    ended: bool = False


def idle_rows(rows) -> list[IdleRow]:
    """Per rank (RankRow-like: rank, idle_ms, idle_reported, step_ms, idle_pct, data_ms,
    exposed_comm_ms, ended, step), ranks that have reported a step."""
    out = []
    for r in rows:
        if r.step < 0 or not math.isfinite(r.step_ms):
            continue
        idle = idle_ms(r.data_ms, r.exposed_comm_ms, r.idle_ms)
        out.append(IdleRow(r.rank, idle, r.step_ms, r.idle_pct, r.data_ms, r.exposed_comm_ms, r.idle_reported,
                           r.ended))
    return out
