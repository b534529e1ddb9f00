"""What the Overview shows of a run with more ranks than a table can hold: one row per node, a heat
strip of every rank, the slowest ranks and the robust outliers, and the table's caption (where the
user is, how it is sorted). Built from tui/state/nodes.py's figures; no Textual widgets here."""

from __future__ import annotations

import math

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.rules.outliers import Threshold, mad_outliers, median, top_k
from ringtop.tui.large_run.spreads import MEMORY_FLOOR, TIME_FLOOR, TOP_K, spread_columns, standouts, state_note
from ringtop.tui.state.nodes import NodeSummary, RankFigures
from ringtop.tui.tables import Column

NODE_COLUMNS: tuple[tuple[str, str, int, bool, int], ...] = (
    # key, label, width, right-aligned, priority (fit_to_width: higher goes first)
    ("node", "node", 14, False, 0),
    ("ranks", "ranks", 5, True, 0),
    ("step_min", "step min", 8, True, 3),
    ("step_median", "median", 8, True, 2),
    ("step_max", "max ms", 8, True, 0),
    ("slowest", "max at", 7, True, 0),
    ("mem_max", "mem max", 9, True, 4),
    ("idle", "idle %", 6, True, 1),
    ("comm", "comm %", 6, True, 5),
    ("tflops", "TFLOP/s", 8, True, 6),
    ("mfu", "MFU", 6, True, 7),
    ("note", "note", 16, False, 0),
)
STRIP_MAX_LINES = 8
"""The heat strip wraps to at most this many lines; beyond, a cell stands for several ranks (their longest
step)."""
HEAT = ((1.05, "green", "<5%"), (1.10, "yellow", "5–10%"), (1.25, "dark_orange", "10–25%"),
        (math.inf, "red", "≥25%"))
"""Step time against the ranks' median: the upper bound of each colour, its style and legend."""
SHARE_FLOOR = Threshold(min_excess_pct=0.0, min_excess=5.0)


def node_columns(table_width: int, tflops_known: bool = False, peak_known: bool = False) -> list[Column]:
    """TFLOP/s once a rank reports it, MFU once a rank's peak is known (else columns of dashes)."""
    spec = tuple(c for c in NODE_COLUMNS if (c[0] != "tflops" or tflops_known) and (c[0] != "mfu" or peak_known))
    return spread_columns(spec, table_width)


def longest_step_rank(nodes: list[NodeSummary]) -> int | None:
    """The rank with the run's longest recent step: its node's `max at` cell is marked."""
    timed = [n for n in nodes if n.slowest_rank is not None and math.isfinite(n.step_max_ms)]
    return max(timed, key=lambda n: (n.step_max_ms, -n.slowest_rank)).slowest_rank if timed else None


def node_cells(n: NodeSummary, longest: int | None) -> dict[str, Text]:
    """`longest`: the rank with the run's longest recent step (`longest_step_rank`)."""
    worst = n.slowest_rank is not None and n.slowest_rank == longest
    return {
        "node": Text(n.host, style="bold"),
        "ranks": Text(str(len(n.ranks))),
        "step_min": Text(fmt.ms(n.step_min_ms)),
        "step_median": Text(fmt.ms(n.step_median_ms)),
        "step_max": Text(fmt.ms(n.step_max_ms), style="bold yellow" if worst else ""),
        "slowest": Text(f"r{n.slowest_rank}" if n.slowest_rank is not None else "-",
                        style="bold yellow" if worst else ""),
        "mem_max": Text(fmt.nbytes(n.mem_max_bytes) if n.mem_max_bytes else "-"),
        "idle": Text(fmt.pct(n.idle_median_pct)),
        "comm": Text(fmt.num(n.comm_median_pct, 1)),
        "tflops": Text(fmt.tflops(n.tflops)),
        "mfu": Text("n/a" if n.mfu is None else fmt.fraction_pct(n.mfu), style="dim" if n.mfu is None else ""),
        "note": state_note(n.dead, n.ended, n.hung, n.silent, n.unreachable, n.flagged, n.marked),
    }


def heat_strip(figures: dict[int, RankFigures], width: int, max_lines: int = STRIP_MAX_LINES) -> Text:
    """One cell per rank in rank order, wrapped at `width`, coloured by its recent step time against
    the median of the ranks' (✖ dead, ⏸ holding the others up, · ended, ░ no step yet); a legend line first.
    More ranks than STRIP_MAX_LINES lines hold: each cell shows its ranks' worst."""
    width = max(10, width)
    ranks = sorted(figures)
    per_cell = max(1, math.ceil(len(ranks) / (width * max(1, max_lines))))
    mid = median(f.step_ms for f in figures.values() if math.isfinite(f.step_ms))
    t = Text()  # lines of `width` cells: nothing to wrap but the legend on a narrow screen
    cell = f"1 cell = {per_cell} ranks (their longest step)" if per_cell > 1 else "1 cell per rank"
    t.append(f"heat: {cell} from rank 0, step time vs the median {fmt.ms(mid)} ms:", style="dim")
    for _, style, label in HEAT:
        t.append(" █", style=style)
        t.append(label, style="dim")
    t.append("  ✖ dead ⏸ hung · ended ░ none", style="dim")
    run, run_style = "", ""  # cells of one style are appended together: a few spans, not one per rank
    for cells, i in enumerate(range(0, len(ranks), per_cell)):
        char, style = _heat_cell([figures[ranks[i]]] if per_cell == 1 else [figures[r] for r in ranks[i:i + per_cell]],
                                 mid)
        if cells % width == 0 or style != run_style:
            t.append(run, style=run_style)
            run, run_style = ("\n" if cells % width == 0 else ""), style
        run += char
    t.append(run, style=run_style)
    return t


def _heat_cell(fs: list[RankFigures], mid: float) -> tuple[str, str]:
    if any(f.dead for f in fs):
        return "✖", "bold red"
    if any(f.hung for f in fs):
        return "⏸", "bold red"
    times = [f.step_ms for f in fs if math.isfinite(f.step_ms)]
    if not times:
        return ("·", "dim") if all(f.ended for f in fs) else ("░", "dim")
    if not (math.isfinite(mid) and mid > 0):
        return "█", HEAT[0][1]
    ratio = max(times) / mid
    return "█", next(style for bound, style, _ in HEAT if ratio < bound)


def rank_outliers(figures: dict[int, RankFigures]) -> dict[str, list[tuple[int, float]]]:
    """Per figure, (rank, robust z) of the ranks above the others by the MAD rule (metrics/rules/outliers.py)."""
    return {
        "step_ms": mad_outliers({r: f.step_ms for r, f in figures.items()}, floor=TIME_FLOOR),
        "mem": mad_outliers({r: float(f.mem_bytes) for r, f in figures.items() if f.mem_bytes > 0},
                            floor=MEMORY_FLOOR),
        "idle_pct": mad_outliers({r: f.idle_pct for r, f in figures.items()}, floor=SHARE_FLOOR),
    }


def standouts_text(figures: dict[int, RankFigures], found: dict[str, list[tuple[int, float]]],
                   width: int = 0) -> Text:
    """`▲ longest steps: r517 node-4 130.3 ms +30% · …` (step time, as the heat strip; the slowest
    rank by compute is the Comm tab's) and the robust outliers per figure, each line cut to `width`
    here (so the drawing does not depend on when the widget learnt its width)."""
    times = {r: f.step_ms for r, f in figures.items()}
    mid = median(v for v in times.values() if math.isfinite(v))

    def describe(rank: int, ms: float) -> str:
        excess = f" {100 * (ms / mid - 1):+.0f}%" if math.isfinite(mid) and mid > 0 else ""
        return f" {figures[rank].host} {fmt.ms(ms)} ms{excess}"
    words = {"step_ms": "step time", "mem": "memory", "idle_pct": "idle"}
    return standouts("longest steps", top_k(times, TOP_K), describe, "no steps yet",
                     [(words[k], v) for k, v in found.items()], width)


def hosts_caption(hosts: dict[str, list[int]], cut_off: set[str]) -> Text:
    """A small run on several nodes: which ranks each holds (its table rows are in rank order)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{len(hosts)} nodes: ", style="bold")
    for i, (host, ranks) in enumerate(hosts.items()):
        if i:
            t.append(" · ", style="dim")
        t.append(host, style="bold")
        t.append(f" {ranks_text(ranks)}")
        if host in cut_off:
            t.append(" ✖ unreachable", style="bold red")
    return t


