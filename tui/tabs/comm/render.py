"""Rendering of the Comm tab (and the Overview's verdict and busbw lines): Rich text for captions
and DataTable cells, from `figures.py`'s figures and the view model's verdicts. No Textual widgets."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.tui.deltas import delta_text
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.reducers import Diagnosis, VerdictState
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import Column, fit_to_width
from ringtop.tui.tabs.comm.figures import (
    COMM_WINDOW,
    CommWindow,
    KindRow,
    PeakRef,
    SlowestRank,
    comm_window,
    slowest_rank,
)
from ringtop.tui.words import words

VERDICT_STYLE = "bold yellow"


# ---------------------------------------------------------------------- per-kind table


KINDS_PRIORITY = {"delta": 5, "pred": 4, "algbw": 3, "count": 2, "link": 1}
"""Dropped first on a narrow terminal (tables.fit_to_width): busbw, busy and exposed time stay."""
RANKS_PRIORITY = {"mb": 4, "busbw": 3, "busy": 2}


KIND_WIDTH, KIND_GROUP_WIDTH = 18, 25
"""The kind column; wider where rows name a mesh dimension ("reduce_scatter · dp n=2")."""


def kinds_columns(width: int = 0, w: CommWindow | None = None) -> list[Column]:
    split = w is not None and any(k.group for k in w.kinds)
    cols = [
        Column("kind", "kind", KIND_GROUP_WIDTH if split else KIND_WIDTH),
        Column("count", "calls/step", 10, True),
        Column("mb", "MiB/step", 8, True),
        Column("pred", "pred MiB", 8, True),
        Column("delta", "Δ", 7, True),
        Column("busy", "busy ms", 8, True),
        Column("algbw", "algbw GB/s", 10, True),
        Column("busbw", "busbw GB/s", 10, True),
        *([Column("link", "of link %", 9, True)] if w is not None and any(k.link_peak_gbps > 0 for k in w.kinds)
          else []),
        Column("exposed", "exposed ms", 10, True),
        Column("overlap", "overlap %", 9, True),
    ]
    return fit_to_width(cols, KINDS_PRIORITY, width) if width else cols


def _kind_label(k: KindRow) -> Text:
    t = Text(k.kind)
    if k.group:
        t.append(" · " + k.group)
    if k.group_sizes:
        t.append(" n=" + ",".join(str(n) for n in k.group_sizes), style="dim")
    return t


def _delta(measured: float, predicted: float | None) -> Text:
    if predicted is None:
        return Text("-", style="dim")
    return delta_text(measured, predicted)


def kinds_rows(w: CommWindow) -> list[tuple[str, dict[str, Text]]]:
    out: list[tuple[str, dict[str, Text]]] = []
    dash = Text("·", style="dim")  # exposed and overlap are measured per step, not per kind
    for k in w.kinds:
        cells = {
            "kind": _kind_label(k),
            "count": Text(fmt.per_step(k.count_per_step)),
            "mb": Text(fmt.mib(k.bytes_per_step)),
            "pred": Text(fmt.mib(k.predicted_bytes), style="italic"),
            "delta": _delta(k.bytes_per_step, k.predicted_bytes),
            "busy": Text(fmt.ms(k.busy_ms_per_step) if k.measured else "-"),
            "algbw": Text(fmt.gbps(k.algbw_gbps)),
            "busbw": Text(fmt.gbps(k.busbw_gbps), style="bold" if k.measured else ""),
            "link": Text(fmt.pct(k.link_pct)) if k.link_peak_gbps > 0 else dash.copy(),
            "exposed": dash.copy(),
            "overlap": dash.copy(),
        }
        if not k.measured:
            for key in ("kind", "count", "mb"):
                cells[key].stylize("yellow")
        out.append((f"k:{k.kind}:{k.group}" if k.group else f"k:{k.kind}", cells))
    if not w.empty:
        overlap = w.overlap_pct
        out.append(("all", {
            "kind": Text("all", style="bold"),
            "count": Text(fmt.per_step(w.count_per_step)),
            "mb": Text(fmt.mib(w.bytes_per_step), style="bold"),
            "pred": Text(fmt.mib(w.predicted_bytes), style="italic"),
            "delta": _delta(w.bytes_per_step, w.predicted_bytes),
            "busy": Text(fmt.ms(w.busy_ms) if w.busy_ms > 0 else fmt.ms(w.kind_busy_ms)),
            "algbw": Text(""),
            "busbw": Text(fmt.gbps(w.busbw_gbps), style="bold"),
            "link": Text(""),
            "exposed": Text(fmt.ms(w.exposed_comm_ms), style="bold"),
            "overlap": Text(fmt.pct(overlap), style="bold " + _overlap_style(overlap)),
        }))
    return out


def _overlap_style(overlap: float) -> str:
    if not math.isfinite(overlap):
        return ""
    return "green" if overlap >= 70 else ("yellow" if overlap >= 30 else "red")


def selection_text(view: RunView, rank: int | None) -> str:
    if rank is None:
        n = len(view.ranks)
        return f"all {n} rank{'s' if n != 1 else ''} (mean per rank)"
    return f"rank {rank}"


_UNSET: Any = object()


def comm_caption(view: RunView, w: CommWindow, rank: int | None, window: int = COMM_WINDOW,
                 slowest: SlowestRank | None = _UNSET) -> Text:
    t = Text()
    t.append("Collectives per step", style="bold")
    t.append(f" — {selection_text(view, rank)}, ")
    if w.empty:
        t.append(f"last {window} steps: none yet", style="dim")
    else:
        span = w.rank_steps if rank is not None else w.last_step - w.first_step + 1
        t.append(f"steps {w.first_step:,}–{w.last_step:,} (last {min(window, span)})")
    t.append("   r: next rank / all", style="dim")
    slow = slowest_rank(view, window) if slowest is _UNSET else slowest
    if slow is not None:
        t.append("\n")
        t.append_text(slowest_text(slow))
    t.append("\nbusy: a kind adds its calls' times, all = their union · busbw = algbw × factor(kind, n) · "
             "pred = cost model", style="dim")
    return t


def slowest_text(s: SlowestRank) -> Text:
    """`slowest rank 1: compute 238 ms/step, +162 % over the others' median 91 ms …`"""
    t = Text()
    t.append("slowest ", style="bold")
    t.append(f"rank {s.rank}", style=VERDICT_STYLE)
    t.append(f": compute {fmt.ms(s.compute_ms)} ms/step, +{s.excess_pct:.0f} % over the others' median "
             f"{fmt.ms(s.others_median_ms)} ms")
    t.append(" (arrives last at collectives)", style="dim")
    return t


def busbw_label(w: CommWindow, ref: PeakRef) -> Text:
    """`busbw X GB/s of PEAK (Y %)`, or with no known peak the highest measured busbw as reference."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("busbw ", style="bold")
    t.append(f"{fmt.gbps(w.busbw_gbps)} GB/s", style="bold")
    if ref.known:
        t.append(f" of {fmt.gbps(ref.gbps)} ({fmt.pct(ref.pct(w.busbw_gbps))} %)")
        t.append(f" peak: {ref.source}" if ref.source else "", style="dim")
    else:
        t.append(" peak unknown", style="yellow")
        if math.isfinite(ref.gbps):
            t.append(f" (max seen {fmt.gbps(ref.gbps)})", style="dim")
    return t


def exposed_text(w: CommWindow) -> Text:
    """`exposed comm Z % of step`, with overlap and idle share beside it (wraps when narrow)."""
    t = Text()
    t.append("exposed comm ", style="bold")
    if w.empty:
        t.append("-", style="dim")
        return t
    t.append(f"{fmt.pct(w.exposed_pct)} % of step", style="bold")
    t.append(f" ({fmt.ms(w.exposed_comm_ms)} of {fmt.ms(w.step_ms)} ms)")
    overlap = w.overlap_pct
    t.append("  overlap ")
    t.append(f"{fmt.pct(overlap)} %", style=_overlap_style(overlap))
    t.append(f" of {fmt.ms(w.busy_ms)} ms busy" if w.busy_ms > 0 else " (busy time not sent)", style="dim")
    t.append(f"  idle {fmt.pct(w.idle_pct)} %")
    t.append(" (data + exposed)", style="dim")
    return t


def overview_comm_label(w: CommWindow, ref: PeakRef) -> Text:
    """The Overview's busbw chart label: busbw, its share of the link's peak, the exposed share of the step."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{'busbw GB/s':<14}", style="bold")
    t.append(f"{fmt.gbps(w.busbw_gbps):>8}")
    if ref.known:
        t.append(f" of {fmt.gbps(ref.gbps)} ({fmt.pct(ref.pct(w.busbw_gbps))}%)")
    else:
        t.append("  link peak unknown (run with --link)", style="dim")
    if not w.empty:
        t.append(f"  exposed comm {fmt.pct(w.exposed_pct)}%")
    return t


# ---------------------------------------------------------------------- per-rank table


def ranks_columns(width: int = 0) -> list[Column]:
    cols = [
        Column("rank", "rank", 6),
        Column("step_ms", "step ms", 8, True),
        Column("mb", "MiB/step", 8, True),
        Column("busy", "busy ms", 8, True),
        Column("exposed", "exposed ms", 10, True),
        Column("compute", "compute ms", 10, True),
        Column("overlap", "overlap%", 8, True),
        Column("idle", "idle%", 6, True),
        Column("busbw", "busbw GB/s", 10, True),
        Column("note", "note", 21),
    ]
    return fit_to_width(cols, RANKS_PRIORITY, width) if width else cols


def ranks_rows(view: RunView, selected: int | None, window: int = COMM_WINDOW,
               slowest: SlowestRank | None = _UNSET, rows: list[RankRow] | None = None
               ) -> list[tuple[str, dict[str, Text]]]:
    """One row per rank of `rows` (every rank by default; a large run's: those on screen)."""
    out = []
    slowest = slowest_rank(view, window) if slowest is _UNSET else slowest
    slow = slowest.rank if slowest is not None else None
    about: dict[int, list[str]] = {}
    for v in view.active_verdicts:
        if v.rank is not None:
            about.setdefault(v.rank, []).append(words(v.rule))
    for row in view.rows() if rows is None else rows:
        w = comm_window(view, row.rank, window)
        notes: list[tuple[str, str]] = []
        if row.rank in about:
            notes.append(("⚠ " + ", ".join(about[row.rank]), VERDICT_STYLE))
        if slow == row.rank:
            notes.append(("slowest", "yellow"))
        if row.ended:
            notes.append(("ended", "dim"))
        note = Text()
        for i, (s, style) in enumerate(notes):
            if i:
                note.append(" ")
            note.append(s, style=style)
        label = Text(("▶ " if selected == row.rank else "  ") + str(row.rank), style="bold")
        overlap = w.overlap_pct
        cells = {
            "rank": label,
            "step_ms": Text(fmt.ms(w.step_ms)),
            "mb": Text(fmt.mib(w.bytes_per_step)),
            "busy": Text(fmt.ms(w.busy_ms) if w.busy_ms > 0 else fmt.ms(w.kind_busy_ms)),
            "exposed": Text(fmt.ms(w.exposed_comm_ms)),
            "compute": Text(fmt.ms(w.compute_ms), style="yellow" if slow == row.rank else ""),
            "overlap": Text(fmt.pct(overlap), style=_overlap_style(overlap)),
            "idle": Text(fmt.pct(w.idle_pct)),
            "busbw": Text(fmt.gbps(w.busbw_gbps)),
            "note": note,
        }
        if row.ended:
            for c in cells.values():
                c.stylize("dim")
        out.append((f"r{row.rank}", cells))
    return out


# ---------------------------------------------------------------------- verdicts


def _evidence(evidence: dict[str, Any]) -> str:
    parts = []
    for k, v in evidence.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{words(k)} {v}")
    return " · ".join(parts)


def _who(v: VerdictState) -> str:
    return f"rank {v.rank}" if v.rank is not None else "whole run"


def verdict_panel(view: RunView, slowest: SlowestRank | None = _UNSET) -> Text:
    """The current verdicts with their evidence and advice, recently cleared ones, the end-of-run
    diagnosis, and the slowest rank."""
    t = Text()
    active = view.active_verdicts
    t.append("Verdicts", style="bold")
    t.append(f"  {len(active)} active" if active else "  none active", style=VERDICT_STYLE if active else "green")
    t.append("  — rank 0's diagnosis of the recent steps; the Events tab has the history", style="dim")
    for v in active:
        t.append("\n⚠ ", style=VERDICT_STYLE)
        t.append(words(v.rule), style=VERDICT_STYLE)
        t.append(f"  {_who(v)}", style="bold")
        if v.step >= 0:
            t.append(f"  since step {v.step:,}", style="dim")
        t.append(f"\n  {v.text}")
        if v.evidence:
            t.append("\n  evidence ", style="bold")
            t.append(_evidence(v.evidence))
        if v.advice:
            t.append("\n  advice   ", style="bold")
            t.append(v.advice, style="cyan")
    cleared = list(view.cleared_verdicts)[-3:]
    if cleared:
        t.append("\ncleared: ", style="dim")
        t.append(", ".join(f"{words(v.rule)} ({_who(v)}"
                           + (f", step {v.cleared_step:,})" if v.cleared_step >= 0 else ")")
                           for v in reversed(cleared)), style="dim")
    d = view.diagnosis
    if d is not None:
        t.append_text(_diagnosis_text(d, {v.key for v in active}))
    slow = slowest_rank(view) if slowest is _UNSET else slowest
    if slow is not None:
        t.append("\n")
        t.append_text(slowest_text(slow))
    return t


def _diagnosis_text(d: Diagnosis, active: set) -> Text:
    t = Text()
    t.append("\nend of run", style="bold")
    if d.step >= 0:
        t.append(f" (step {d.step:,})", style="dim")
    if not d.verdicts:
        t.append(": no problems found", style="green")
        return t
    t.append(f": {len(d.verdicts)} finding{'s' if len(d.verdicts) != 1 else ''} during the run", style=VERDICT_STYLE)
    for v in d.verdicts:
        t.append("\n  • ")
        t.append(words(v.rule), style=VERDICT_STYLE)
        if v.key in active:
            t.append(f" ({_who(v)}): still active, above", style="dim")
            continue
        t.append(f" ({_who(v)}): {v.text}")
        if v.advice:
            t.append(f"\n    advice: {v.advice}", style="cyan")
    return t


def alert_verdict_line(view: RunView) -> Text | None:
    """The Overview's one-line warning: the newest active verdict, else the end-of-run diagnosis."""
    active = view.active_verdicts
    if active:
        v = active[0]
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("⚠ ", style=VERDICT_STYLE)
        t.append(v.text, style=VERDICT_STYLE)
        more = f"  +{len(active) - 1} more" if len(active) > 1 else ""
        t.append(f"{more}  (3: Comm)", style="dim")
        return t
    d = view.diagnosis
    if d is None:
        return None
    t = Text(no_wrap=True, overflow="ellipsis")
    if not d.verdicts:
        t.append("✓ diagnosis: no problems found", style="green")
        return t
    t.append("⚠ ", style=VERDICT_STYLE)
    t.append("end-of-run diagnosis: ", style=VERDICT_STYLE)
    t.append("; ".join(v.text for v in d.verdicts))
    t.append("  (3: Comm)", style="dim")
    return t
