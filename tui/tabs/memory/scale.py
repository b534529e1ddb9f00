"""The Memory tab of a run with more ranks than a table can hold: one row per node (min / median /
max of the memory each rank holds, the rank holding most named), the ranks holding most and the
robust outliers below. Each rank's figures are read once per build; no Textual widgets here."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.rules.outliers import mad_outliers, median, top_k
from ringtop.tui.deltas import pct_diff
from ringtop.tui.large_run.spreads import MEMORY_FLOOR, TOP_K, spread_columns, standouts, state_note
from ringtop.tui.state.nodes import UNKNOWN_HOST, Spread, by_host, ranks_by, spread
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import Column
from ringtop.tui.tabs.memory.figures import predicted_state


@dataclass(frozen=True, slots=True)
class MemFigures:
    """One rank's memory, bytes as floats (NaN: not measured yet)."""

    rank: int
    host: str
    mem: float
    """CUDA allocated on a GPU, else process RSS (RankRow.mem_bytes)."""
    state: float
    other: float
    peak: float
    pred_pct: float
    """Counted state against the cost model's, in percent (NaN without either)."""
    dead: bool
    ended: bool


def _or_nan(n: int) -> float:
    return float(n) if n > 0 else math.nan


def memory_figures(view: RunView) -> dict[int, MemFigures]:
    out = {}
    for r in view.ranks.values():
        p = predicted_state(view, r)
        counted = r.mem_state_bytes > 0
        out[r.rank] = MemFigures(
            rank=r.rank, host=r.host or UNKNOWN_HOST, mem=_or_nan(r.mem_bytes), state=_or_nan(r.mem_state_bytes),
            other=float(r.mem_other_bytes) if r.mem_bytes else math.nan, peak=_or_nan(r.mem_cuda_peak_bytes),
            pred_pct=pct_diff(r.mem_state_bytes, p.total_bytes) if p is not None and counted else math.nan,
            dead=r.dead, ended=r.ended)
    return out


FIGURES = {"mem": lambda f: f.mem, "state": lambda f: f.state, "other": lambda f: f.other,
           "peak": lambda f: f.peak, "pred": lambda f: f.pred_pct}


@dataclass(frozen=True, slots=True)
class MemNode:
    host: str
    ranks: tuple[int, ...]
    spreads: dict[str, Spread]
    """Per FIGURES key."""
    dead: int
    ended: int


def memory_nodes(figures: dict[int, MemFigures]) -> list[MemNode]:
    """One per host, in host order."""
    out = []
    for host, ranks in by_host({r: f.host for r, f in figures.items()}).items():
        fs = [figures[r] for r in ranks]
        out.append(MemNode(host, tuple(ranks), {k: spread({f.rank: get(f) for f in fs}) for k, get in FIGURES.items()},
                           dead=sum(f.dead for f in fs), ended=sum(f.ended and not f.dead for f in fs)))
    return out


def sort_memory_nodes(nodes: list[MemNode], key: str) -> list[MemNode]:
    """Most memory (or state) held by any of its ranks first; "rank": by the node's first rank."""
    if key in FIGURES:
        return sorted(nodes, key=lambda n: (-n.spreads[key].max if math.isfinite(n.spreads[key].max) else math.inf,
                                            n.host))
    return sorted(nodes, key=lambda n: (n.ranks[0] if n.ranks else 0, n.host))


def sort_memory_ranks(ranks: list[int], figures: dict[int, MemFigures], key: str) -> list[int]:
    if key in FIGURES:
        return ranks_by(ranks, {r: FIGURES[key](figures[r]) for r in ranks})
    return sorted(ranks)


def node_columns(gpu: bool, table_width: int) -> list[Column]:
    what = "alloc" if gpu else "RSS"
    spec = (
        # key, label, width, right-aligned, priority (fit_to_width: higher goes first)
        ("node", "node", 14, False, 0),
        ("ranks", "ranks", 5, True, 0),
        ("mem_min", f"{what} min", 9, True, 3),
        ("mem_median", "median", 9, True, 2),
        ("mem_max", "max", 9, True, 0),
        ("most", "most", 6, True, 0),
        ("state", "state max", 9, True, 4),
        ("other", "other max", 9, True, 5),
        *((("peak", "peak max", 9, True, 6),) if gpu else ()),
        ("pred", "state vs pred", 13, True, 1),
        ("note", "note", 16, False, 0),
    )
    return spread_columns(spec, table_width)


def _bytes(x: float) -> Text:
    return Text(fmt.nbytes(x) if math.isfinite(x) else "-")


def node_cells(n: MemNode, most_overall: int | None) -> dict[str, Text]:
    mem, pred = n.spreads["mem"], n.spreads["pred"]
    worst = mem.worst is not None and mem.worst == most_overall
    style = "bold yellow" if worst else ""
    pred_text = "-" if pred.worst is None else (
        fmt.delta_pct(pred.max) if pred.min == pred.max else f"{fmt.delta_pct(pred.min)}…{fmt.delta_pct(pred.max)}")
    return {
        "node": Text(n.host, style="bold"),
        "ranks": Text(str(len(n.ranks))),
        "mem_min": _bytes(mem.min),
        "mem_median": _bytes(mem.median),
        "mem_max": Text(_bytes(mem.max).plain, style=style),
        "most": Text(f"r{mem.worst}" if mem.worst is not None else "-", style=style),
        "state": _bytes(n.spreads["state"].max),
        "other": _bytes(n.spreads["other"].max),
        "peak": _bytes(n.spreads["peak"].max),
        "pred": Text(pred_text),
        "note": state_note(n.dead, n.ended),
    }


def most_memory(figures: dict[int, MemFigures]) -> int | None:
    """The rank holding the most memory (the lower rank on a tie)."""
    top = top_k({r: f.mem for r, f in figures.items()}, 1)
    return top[0][0] if top else None


def memory_standouts(figures: dict[int, MemFigures], width: int = 0) -> Text:
    """`▲ most memory: r5 node-0 640.0MiB +6% · …` and the ranks above the others by the MAD rule."""
    mem = {r: f.mem for r, f in figures.items()}
    mid = median(v for v in mem.values() if math.isfinite(v))

    def describe(rank: int, value: float) -> str:
        excess = f" {100 * (value / mid - 1):+.0f}%" if math.isfinite(mid) and mid > 0 else ""
        return f" {figures[rank].host} {fmt.nbytes(value)}{excess}"
    found = [("memory", mad_outliers(mem, floor=MEMORY_FLOOR)),
             ("state", mad_outliers({r: f.state for r, f in figures.items()}, floor=MEMORY_FLOOR))]
    return standouts("most memory", top_k(mem, TOP_K), describe, "nothing measured yet", found, width)
