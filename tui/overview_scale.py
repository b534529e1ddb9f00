"""What the Overview shows of a run with more ranks than a table can hold: one row per node, a heat
strip of every rank, the slowest ranks and the robust outliers, and the table's caption (where the
user is, how it is sorted). Built from tui/nodes.py's figures; no Textual widgets here."""

from __future__ import annotations

import math

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.outliers import MAD_Z_FLAG, Threshold, mad_outliers, median, top_k
from ringtop.metrics.rank_sets import ranks_text

from .nodes import SORT_LABELS, NodeSummary, RankFigures
from .tables import Column, fit_to_width

NODE_COLUMNS: tuple[tuple[str, str, int, bool, int], ...] = (
    # key, label, width, right-aligned, priority (fit_to_width: higher goes first)
    ("node", "node", 14, False, 0),
    ("ranks", "ranks", 5, True, 0),
    ("step_min", "step min", 8, True, 3),
    ("step_median", "median", 8, True, 2),
    ("step_max", "max ms", 8, True, 0),
    ("slowest", "slowest", 7, True, 0),
    ("mem_max", "mem max", 9, True, 4),
    ("idle", "idle %", 6, True, 1),
    ("comm", "comm %", 6, True, 5),
    ("tflops", "TFLOP/s", 8, True, 6),
    ("mfu", "MFU", 6, True, 7),
    ("note", "note", 16, False, 0),
)
TOP_K = 5
"""The slowest ranks named below the heat strip."""
STRIP_MAX_LINES = 8
"""The heat strip wraps to at most this many lines; beyond, a cell stands for several ranks (their slowest)."""
HEAT = ((1.05, "green", "<5%"), (1.10, "yellow", "5–10%"), (1.25, "dark_orange", "10–25%"),
        (math.inf, "red", "≥25%"))
"""Step time against the ranks' median: the upper bound of each colour, its style and legend."""
TIME_FLOOR = Threshold(min_excess_pct=5.0, min_excess=2.0)
"""A robust outlier must also be this far above the median (tight steps make 1 ms a large z)."""
MEMORY_FLOOR = Threshold(min_excess_pct=5.0, min_excess=64 * 2**20)
SHARE_FLOOR = Threshold(min_excess_pct=0.0, min_excess=5.0)


def node_columns(table_width: int, tflops_known: bool = False, peak_known: bool = False) -> list[Column]:
    """TFLOP/s once a rank reports it, MFU once a rank's peak is known (else columns of dashes)."""
    spec = tuple(c for c in NODE_COLUMNS if (c[0] != "tflops" or tflops_known) and (c[0] != "mfu" or peak_known))
    return spread_columns(spec, table_width)


def node_cells(n: NodeSummary, slowest_overall: int | None) -> dict[str, Text]:
    worst = n.slowest_rank is not None and n.slowest_rank == slowest_overall
    return {
        "node": Text(n.host, style="bold"),
        "ranks": Text(str(len(n.ranks))),
        "step_min": Text(fmt.ms(n.step_min_ms)),
        "step_median": Text(fmt.ms(n.step_median_ms)),
        "step_max": Text(fmt.ms(n.step_max_ms), style="bold yellow" if worst else ""),
        "slowest": Text(f"r{n.slowest_rank}" if n.slowest_rank is not None else "-",
                        style="bold yellow" if worst else ""),
        "mem_max": Text(fmt.nbytes(n.mem_max_bytes) if n.mem_max_bytes else "-"),
        "idle": Text(fmt.num(n.idle_median_pct, 1)),
        "comm": Text(fmt.num(n.comm_median_pct, 1)),
        "tflops": Text(fmt.tflops(n.tflops)),
        "mfu": Text("n/a" if n.mfu is None else fmt.fraction_pct(n.mfu), style="dim" if n.mfu is None else ""),
        "note": state_note(n.dead, n.ended, n.hung, n.silent, n.unreachable),
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
    cell = f"1 cell = {per_cell} ranks (their slowest)" if per_cell > 1 else "1 cell per rank"
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
    """Per figure, (rank, robust z) of the ranks above the others by the MAD rule (metrics/outliers.py)."""
    return {
        "step_ms": mad_outliers({r: f.step_ms for r, f in figures.items()}, floor=TIME_FLOOR),
        "mem": mad_outliers({r: float(f.mem_bytes) for r, f in figures.items() if f.mem_bytes > 0},
                            floor=MEMORY_FLOOR),
        "idle_pct": mad_outliers({r: f.idle_pct for r, f in figures.items()}, floor=SHARE_FLOOR),
    }


def standouts_text(figures: dict[int, RankFigures], found: dict[str, list[tuple[int, float]]],
                   width: int = 0) -> Text:
    """`▲ slowest: r517 node-4 130.3 ms +30% · …` and the robust outliers per figure, each line cut
    to `width` here (so the drawing does not depend on when the widget learnt its width)."""
    times = {r: f.step_ms for r, f in figures.items()}
    mid = median(v for v in times.values() if math.isfinite(v))

    def describe(rank: int, ms: float) -> str:
        excess = f" {100 * (ms / mid - 1):+.0f}%" if math.isfinite(mid) and mid > 0 else ""
        return f" {figures[rank].host} {fmt.ms(ms)} ms{excess}"
    words = {"step_ms": "step time", "mem": "memory", "idle_pct": "idle"}
    return standouts("slowest", top_k(times, TOP_K), describe, "no steps yet",
                     [(words[k], v) for k, v in found.items()], width)


def standouts(title: str, top: list[tuple[int, float]], describe, none: str,
              found: list[tuple[str, list[tuple[int, float]]]], width: int = 0) -> Text:
    """Two lines any tab's large table has below it: `▲ TITLE: rN <describe(N, value)> · …` for its
    top-k ranks, and the robust outliers per figure (`found`: (word, [(rank, z)])), cut to `width`."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"▲ {title}: ", style="bold yellow")
    if not top:
        t.append(none, style="dim")
    for i, (rank, value) in enumerate(top):
        if i:
            t.append(" · ", style="dim")
        t.append(f"r{rank}", style="bold")
        t.append(describe(rank, value))
    t.append("\n")
    t.append(f"◆ outliers (robust z ≥ {MAD_Z_FLAG:g}): ", style="bold yellow")
    parts = [(word, hits) for word, hits in found if hits]
    if not parts:
        t.append("none", style="dim")
    for i, (word, hits) in enumerate(parts):
        if i:
            t.append("; ", style="dim")
        t.append(f"{word} ")
        t.append(", ".join(f"r{r} z {z:.0f}" if math.isfinite(z) else f"r{r}" for r, z in hits[:4]), style="bold")
        if len(hits) > 4:
            t.append(f" +{len(hits) - 4}", style="dim")
    if width > 0:
        lines = t.split("\n")
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        t = Text("\n", no_wrap=True).join(lines)
    return t


def spread_columns(spec: tuple[tuple[str, str, int, bool, int], ...], table_width: int) -> list[Column]:
    """A node table's columns from (key, label, width, right-aligned, priority): those that fit,
    the spare width given to the `note` column."""
    cols = [Column(k, label, w, right) for k, label, w, right, _ in spec]
    kept = fit_to_width(cols, {k: p for k, _, _, _, p in spec}, table_width)
    spare = max(0, table_width - sum(c.width + 2 for c in kept))
    return [c._replace(width=min(40, c.width + spare)) if c.key == "note" else c for c in kept]


def state_note(dead: int, ended: int, hung: int = 0, silent: int = 0, unreachable: bool = False) -> Text:
    """A node row's note: unreachable (none of its ranks heard), or how many are dead, hung, silent, ended."""
    if unreachable:
        return Text("unreachable", style="bold red")
    notes = [f"{count} {what}" for count, what in ((dead, "dead"), (hung, "hung"), (silent, "silent"),
                                                   (ended, "ended")) if count]
    return Text(" · ".join(notes), style="bold red" if dead or hung else "yellow" if silent else "dim")


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


def table_caption(level: str, *, nodes: int, ranks: int, shown: int, first: int, total: int, sort: str,
                  host: str | None, filter_text: str) -> Text:
    """Where the user is, the order, the rows on screen, and the keys that move on."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if level == "nodes":
        t.append(f"{nodes} nodes · {ranks:,} ranks", style="bold")
        keys = "↑↓ PgUp/PgDn move · Enter a node's ranks · o sort · / filter"
    elif level == "node":
        t.append(f"node {host}: {total} ranks", style="bold")
        keys = "↑↓ PgUp/PgDn move · Esc the nodes · o sort · / filter"
    else:
        t.append(f"filter {filter_text!r}: {total:,} of {ranks:,} ranks", style="bold")
        keys = "↑↓ PgUp/PgDn move · Esc clear the filter · o sort"
    t.append(f" · by {SORT_LABELS.get(sort, sort)}", style="bold")
    if total > shown:
        t.append(f" · rows {first + 1}–{first + shown} of {total:,}")
    t.append(f"   {keys}", style="dim")
    return t
