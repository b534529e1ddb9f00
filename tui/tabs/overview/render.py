"""What the Overview shows, as an immutable `OverviewModel` built from the view model: the rank
table's columns and cells, the charts' series and labels, the alert lines. No Textual widgets here
(widget.py draws the model); the same functions serve tests and screenshots."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics import step_waterfall as wf
from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.fmt import mb_compact
from ringtop.metrics.rules.outliers import CELL_MEMORY, CELL_SHARE, CELL_TIME, Threshold, outliers
from ringtop.metrics.rules.peaks import implausible
from ringtop.tui.state.marks import Mark
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.readings import SLOWEST_WINDOW
from ringtop.tui.state.view_model import RunView
from ringtop.tui.styles import LEVEL_STYLE
from ringtop.tui.tables import DEFAULT_TABLE_WIDTH, Column, fit_to_width
from ringtop.tui.tabs.comm.render import alert_verdict_line
from ringtop.tui.tabs.overview.model import ChartModel
from ringtop.tui.tabs.overview.parts import window_parts

COMM_KIND_ABBR = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC",
                  "reduce": "RD", "all_to_all": "A2A", "send": "P2P", "recv": "P2P", "barrier": "BAR"}
"""The collective kinds as the Overview's per-kind cell names them."""
BREAKDOWN_WIDTH = 10
BREAKDOWN_STYLES = {wf.IDEAL: "bold green", wf.COMPUTE_BELOW_PEAK: "green", wf.COMPUTE: "green",
                    wf.EXPOSED_COMM: "red", wf.BUBBLE: "yellow", wf.DATA: "cyan", wf.OPTIMIZER: "magenta",
                    wf.REST: "dim"}
"""Where the step went (metrics/step_waterfall.py: the parts summary, report and diff show), one
colour each; the rest is drawn ░."""


@dataclass(frozen=True)
class RankColumn:
    key: str
    label: str
    width: int
    priority: int
    """Lower stays longer: on a narrow terminal the highest numbers are dropped first."""
    numeric: bool = True


# Widths fixed so in-place updates never reflow the table. The per-kind communication column
# ("comm_kinds") goes after "comm_mb_s" once the run's collectives are known, "mfu" once a rank's
# device peak is (a Hello's peak_tflops, else it would be a column of "n/a"); "note" takes the
# width that is left (at least NOTE_MIN_WIDTH), so its text is not cut while there is room.
RANK_COLUMNS: tuple[RankColumn, ...] = (
    RankColumn("rank", "rank", 4, 0),
    RankColumn("host", "host", 8, 12, numeric=False),
    RankColumn("step", "step", 6, 2),
    RankColumn("step_ms", "step ms", 8, 0),
    RankColumn("loss", "loss", 6, 3),
    RankColumn("breakdown", "step parts", BREAKDOWN_WIDTH, 8, numeric=False),
    RankColumn("tok_s", "tok/s", 6, 10),
    RankColumn("tflops", "TFLOP/s", 7, 13),
    RankColumn("mfu", "MFU", 6, 7),
    RankColumn("mem", "mem", 10, 4),
    RankColumn("comm_mb_s", "comm MB/s", 9, 5),
    RankColumn("comm_kinds", "", 0, 9),
    RankColumn("idle_pct", "idle %", 6, 1),
    RankColumn("cpu", "cpu %", 5, 11),
    RankColumn("drops", "drops", 5, 6),
    RankColumn("note", "note", 0, 0, numeric=False),
)
NOTE_MIN_WIDTH = 16
NOTE_MAX_WIDTH = 40


def kind_abbr(kind: str) -> str:
    """AR, RS, AG, BC for the common collectives; initials of the words otherwise."""
    return COMM_KIND_ABBR.get(kind) or "".join(w[:1] for w in kind.split("_")).upper() or "?"


def overview_columns(kinds: list[str], kinds_cell_width: int = 0, table_width: int = DEFAULT_TABLE_WIDTH,
                     breakdown: bool = True, peak_known: bool = False) -> list[Column]:
    """The rank table's columns for a table `table_width` cells wide: the lowest-priority columns
    are dropped until the rest fit, the note takes what is left. With collective kinds, one more
    after "comm MB/s": per kind MB/s, e.g. "RS/AG MB/s" holding "12.5/25.0", as wide as its
    widest cell so far."""
    kinds_label = "/".join(kind_abbr(k) for k in kinds) + " MB/s" if kinds else ""
    cols, priority = [], {}
    for c in RANK_COLUMNS:
        if ((c.key == "comm_kinds" and not kinds) or (c.key == "breakdown" and not breakdown)
                or (c.key == "mfu" and not peak_known)):
            continue
        width = c.width
        if c.key == "comm_kinds":
            width = max(len(kinds_label), kinds_cell_width)
        elif c.key == "note":
            width = NOTE_MIN_WIDTH
        cols.append(Column(c.key, kinds_label if c.key == "comm_kinds" else c.label, width, c.numeric))
        priority[c.key] = c.priority
    kept = fit_to_width(cols, priority, table_width)
    spare = max(0, table_width - sum(c.width + 2 for c in kept))
    return [c._replace(width=min(NOTE_MAX_WIDTH, NOTE_MIN_WIDTH + spare)) if c.key == "note" else c for c in kept]


def breakdown_bar(row: RankRow, width: int = BREAKDOWN_WIDTH, pipeline: bool = False) -> Text:
    """A rank's step over its window (parts.window_parts, the window of its step ms) as one bar of
    its parts, each part's share of the step in cells, rounded so the parts fill `width`."""
    parts = window_parts(row, pipeline)
    total = sum(parts.values())
    if not total > 0:
        return Text("-")
    t = Text(no_wrap=True)
    edges, acc = [], 0.0
    for ms_part in parts.values():
        acc += ms_part
        edges.append(round(width * acc / total))
    start = 0
    for name, end in zip(parts, edges):
        if end > start:
            t.append(("░" if name == wf.REST else "█") * (end - start), style=BREAKDOWN_STYLES[name])
        start = end
    return t


def breakdown_legend(parts: dict[str, float]) -> Text:
    """Which window the table is over and what its ▲ compares, then the run's step as its parts
    (`run_line`): every part a bar can show, named in `summary`'s words with its colour."""
    t = Text()  # wraps on a narrow screen: every part stays named
    t.append_text(window_legend())
    t.append("\n")
    t.append_text(run_line(parts))
    return t


def run_line(parts: dict[str, float]) -> Text:
    """`run 152.3 ms/step = █ compute 98.0 ms 64% · █ exposed communication 44.1 ms 29% · …`: the
    run's mean step over the window (parts.run_parts), each part in ms and its share, in the words
    of `summary`'s waterfall (metrics/step_waterfall.py); `ideal` where the device's peak is known."""
    step = sum(parts.values())
    t = Text()
    t.append("run ", style="bold")
    if not step > 0:
        t.append("waiting for timed steps", style="dim")
        return t
    t.append(f"{fmt.ms(step)} ms/step = ", style="bold")
    for i, (name, ms_part) in enumerate(parts.items()):
        if i:
            t.append(" · ", style="dim")
        t.append("░" if name == wf.REST else "█", style=BREAKDOWN_STYLES[name])
        t.append(f" {name} {fmt.ms(ms_part)} ms {100 * ms_part / step:.0f}%")
    return t


def window_legend() -> Text:
    """Which window the ranks table's step ms, idle % and step parts (and its ▲ marker) are over,
    and what the ▲ compares: compute, as the Comm tab and the straggler verdict do (RunView.slowest)."""
    return Text(f"step ms, idle %, step parts: each rank's last {SLOWEST_WINDOW} steps · ▲ slowest: most compute "
                "(step − waits)", style="dim", no_wrap=True, overflow="ellipsis")


OUTLIER_STYLE = "bold yellow"
OUTLIER_COLUMNS: tuple[tuple[str, str, Threshold], ...] = (
    ("step_ms", "window_step_ms", CELL_TIME),
    ("idle_pct", "window_idle_pct", CELL_SHARE),
    ("mem", "mem_bytes", CELL_MEMORY),
)
"""(column, RankRow attribute, threshold): cells highlighted when the rank is that far above the
other live ranks (the one outlier rule, ringtop.metrics.rules.outliers)."""


def outlying_cells(view: RunView) -> dict[str, frozenset[int]]:
    """Per column, the live ranks whose value stands out above the others'."""
    live = [r for r in view.ranks.values() if not r.ended and not r.dead and r.step >= 0]
    out = {}
    for column, attr, threshold in OUTLIER_COLUMNS:
        values = {r.rank: float(getattr(r, attr)) for r in live}
        if column == "mem":
            values = {rank: v for rank, v in values.items() if v > 0}
        out[column] = frozenset(o.rank for o in outliers(values, threshold))
    return out


def row_cells(view: RunView, row: RankRow, replay: bool,
              outlying: dict[str, frozenset[int]] | None = None, mark: Mark | None = None) -> dict[str, Text]:
    """`mark`: the rank's trouble (tui/state/marks.py), said in its note before all but its death."""
    shown = view.slowest_shown
    slow = shown is not None and shown.rank == row.rank and not row.ended
    dim = "dim" if row.ended else ""
    mem = fmt.nbytes(row.mem_bytes) if row.mem_bytes else "-"
    if row.mem_is_cuda and row.device_mem_total_bytes:
        mem = f"{row.mem_cuda_bytes / 2**30:.1f}/{row.device_mem_total_bytes / 2**30:.0f}GiB"
    note, note_style = "", ""
    if row.dead:
        note, note_style = f"dead: silent {fmt.ago(row.silent_s)}", "bold red"
    elif row.stuck and not row.ended:
        note, note_style = f"{row.stuck.split(')')[0]}): silent {fmt.ago(row.silent_s)}", "bold red"
    elif mark is not None and not row.ended:
        note, note_style = mark.note, mark.style
    elif row.ended:
        note, note_style = f"ended: {row.bye_reason}", ("" if row.bye_ok else "red")
    elif not replay and row.silent_s > view.stale_after_s:
        cut_off = row.host in view.cut_off_hosts
        note = f"{'node unreachable: ' if cut_off else ''}silent {fmt.ago(row.silent_s)}"
        note_style = "bold red" if cut_off else "yellow"
    elif slow:
        note, note_style = f"▲ slowest: compute +{shown.excess_pct:.0f}%", "bold yellow"
    cells = {
        "rank": (str(row.rank), "bold"),
        "host": (row.host or "?", ""),
        "step": (f"{row.step:,}" if row.step >= 0 else "-", ""),
        "step_ms": (fmt.ms(row.recent_step_ms()), ""),
        # a loss only from a step this UI received: one it never got is not a NaN
        "loss": (fmt.loss(row.loss) if row.step_seen is not None else "-",
                 "bold red" if row.step_seen is not None and not math.isfinite(row.loss) else ""),
        "tok_s": (fmt.count(row.tokens_per_s) if row.tokens_per_s else "-", ""),
        "tflops": tflops_cell(row),
        "mfu": mfu_cell(row),
        "mem": (mem, ""),
        "comm_mb_s": (fmt.num(row.comm_mb_s, 1) if math.isfinite(row.comm_mb_s) else "-", ""),
        "comm_kinds": ("/".join(mb_compact(row.comm_kind_mb_s[k]) if k in row.comm_kind_mb_s else "-"
                                for k in view.comm_kinds) if row.step >= 0 else "-", ""),
        "idle_pct": (fmt.pct(row.window_idle_pct), ""),
        "cpu": (fmt.num(row.cpu_percent, 0), ""),
        "drops": (f"{row.drops:,}", "yellow" if row.drops else ""),
        "note": (note, note_style),
    }
    for column, ranks in (outlying or {}).items():
        if row.rank in ranks and not cells[column][1]:
            cells[column] = (cells[column][0], OUTLIER_STYLE)
    out = {key: Text(text, style=" ".join(s for s in (style, dim) if s)) for key, (text, style) in cells.items()}
    out["breakdown"] = breakdown_bar(row, pipeline=view.facts.strategy == "pp")
    return out


def tflops_cell(row: RankRow) -> tuple[str, str]:
    """The rank's TFLOP/s; marked `?` in red above the most its device can do (not a measurement)."""
    if implausible(row.tflops, row.tflops_ceiling):
        return f"{fmt.tflops(row.tflops)} ?", "bold red"
    return fmt.tflops(row.tflops), ""


def mfu_cell(row: RankRow) -> tuple[str, str]:
    """`38.2%`; `n/a` on a rank whose device peak is not known; `-` before its TFLOP/s are; `?`
    when its TFLOP/s are implausible."""
    if row.peak_tflops <= 0:
        return "n/a", "dim"
    if implausible(row.tflops, row.tflops_ceiling):
        return "?", "bold red"
    ratio = mfu(row.tflops, row.peak_tflops) if row.tflops > 0 else None
    return (fmt.fraction_pct(ratio) if ratio is not None else "-"), ""


OWN_LOOP_GRAD_NORM = ("the loop gives none: set step.grad_norm (or step_end(grad_norm=…)) to what "
                      "clip_grad_norm_ returns")
"""Why an own loop's grad-norm chart is empty: ringtop does not clip the script's gradients, and
reads no norm the script did not hand it."""


TRAINER_GRAD_NORM = "the trainer hands its callbacks no norm"


def grad_norm_missing(view: RunView) -> str:
    """Why the grad-norm chart has no value, for `chart_model`'s `missing` ("": the steps will carry
    one, as every strategy of ringtop's own loop computes it)."""
    options = view.facts.strategy_options
    if options.get("loop") != "own":
        return ""
    return TRAINER_GRAD_NORM if options.get("trainer") else OWN_LOOP_GRAD_NORM


MIN_CHART_POINTS = 2
"""Fewer points than this draw no chart: one point says nothing about a trend."""


def chart_model(name: str, unit: str, data: list[float], steps: tuple[int, int] | None, f,
                missing: str = "") -> ChartModel:
    """`step time (max of ranks), ms   now 110.2   steps 1,200–1,440`, and the axis' max/min.
    `missing`: why the steps carry no value of this series, said once steps arrive without one."""
    finite = [x for x in data if math.isfinite(x)]
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(name, style="bold")
    t.append(f", {unit}" if unit else "", style="bold")
    if not finite and missing and steps is not None and steps[1] - steps[0] + 1 >= MIN_CHART_POINTS:
        t.append(f"   n/a: {missing}", style="dim")
        return ChartModel(t, ())
    if len(finite) < MIN_CHART_POINTS:
        t.append("   waiting for steps" if not finite else f"   now {f(finite[-1])}, waiting for more steps",
                 style="dim")
        return ChartModel(t, ())
    t.append(f"   now {f(finite[-1])}")
    t.append(f"   min {f(min(finite))}  max {f(max(finite))}", style="dim")
    if steps is not None:
        t.append(f"   steps {steps[0]:,}–{steps[1]:,}", style="dim")
    return ChartModel(t, tuple(finite), top=f(max(finite)), bottom=f(min(finite)))


def alert_text(view: RunView) -> Text:
    """Below the charts: the verdict line, the slowest rank with its numbers, the latest warning."""
    t = Text(no_wrap=True, overflow="ellipsis")
    verdict = alert_verdict_line(view)
    if verdict is not None:
        t.append_text(verdict)
    slow = view.slowest_shown
    if slow is not None:
        row = view.ranks[slow.rank]
        if t.plain:
            t.append("\n")
        t.append("▲ ", style="bold yellow")
        t.append(f"rank {row.rank} slowest: compute {fmt.ms(slow.value_ms)} ms/step (step − waits) over the last "
                 f"{min(len(row.comm_history), SLOWEST_WINDOW)} steps, +{slow.excess_pct:.0f}% vs the others' "
                 f"median {fmt.ms(slow.others_median_ms)} ms")
        stat = row.step_ms_stat
        if stat.count:
            t.append(f"   its step over the run: mean {fmt.ms(stat.mean)} ms, min {fmt.ms(stat.min)}, "
                     f"max {fmt.ms(stat.max)}",
                     style="dim")
    w = view.last_warning
    if w is not None:
        if t.plain:
            t.append("\n")
        t.append("⚠ " if w.level == "warn" else "✖ ", style=LEVEL_STYLE.get(w.level, ""))
        who = f"rank {w.rank}: " if w.rank is not None else ""
        t.append(f"{fmt.clock(w.ts)} {who}{w.text}")
    return t
