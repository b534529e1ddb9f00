"""The Comm tab of a run with more ranks than a table can hold: each rank's window read once (sums
of its last COMM_WINDOW steps, not a per-kind summary per rank), one row per node (min / median /
max of compute per step, the rank the others wait for named), the slowest ranks and the robust
outliers below. No Textual widgets here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice

from rich.text import Text

from ringtop.metrics import fmt
from ringtop.metrics.rules.outliers import mad_outliers, median, top_k
from ringtop.metrics.timing import compute_ms, share_pct
from ringtop.tui.large_run.spreads import TIME_FLOOR, TOP_K, spread_columns, standouts, state_note
from ringtop.tui.state.nodes import UNKNOWN_HOST, Spread, by_host, ranks_by, spread
from ringtop.tui.state.reducers.comm import CommStep
from ringtop.tui.state.view_model import RunView
from ringtop.tui.tables import Column
from ringtop.tui.tabs.comm.figures import COMM_WINDOW, window_means


@dataclass(frozen=True, slots=True)
class RankComm:
    """One rank's means per step over its window (NaN before its first step)."""

    rank: int
    host: str
    step_ms: float
    compute_ms: float
    exposed_comm_ms: float
    idle_pct: float
    busbw_gbps: float
    bytes_per_step: float
    dead: bool
    ended: bool
    live: bool
    """Not ended and with a window: what the slowest rank is chosen among while any is."""
    source: tuple = ()
    """What it was read from (the row, its version, its state): unchanged, it is reused."""


def rank_comm(view: RunView, window: int = COMM_WINDOW,
              previous: dict[int, RankComm] | None = None) -> dict[int, RankComm]:
    """Per rank, the figures of `rank_window` that its node row needs, from the same sums and means
    (`window_means`) without its per-kind rows: O(window) per rank that moved on since `previous`
    (the ranks that did not are taken from it), the newest steps read from the end of its history."""
    world = view.facts.world_size
    out = {}
    previous = previous or {}
    for r in view.ranks.values():
        source = (id(r), r.version, r.dead, r.ended, world, window)
        held = previous.get(r.rank)
        if held is not None and held.source == source:
            out[r.rank] = held
            continue
        samples = list(islice(reversed(r.comm_history), window))
        total = CommStep(step=-1)
        for s in reversed(samples):  # oldest first, as rank_window sums them
            total.add_timed(s, s.idle_ms)
        m = window_means(total, world)
        if m is None:
            out[r.rank] = RankComm(r.rank, r.host or UNKNOWN_HOST, *(math.nan,) * 6, dead=r.dead, ended=r.ended,
                                   live=False, source=source)
            continue
        out[r.rank] = RankComm(
            rank=r.rank, host=r.host or UNKNOWN_HOST, step_ms=m.step_ms,
            compute_ms=compute_ms(m.step_ms, m.exposed_comm_ms, m.data_ms), exposed_comm_ms=m.exposed_comm_ms,
            idle_pct=share_pct(m.idle_ms, m.step_ms), busbw_gbps=m.busbw_gbps, bytes_per_step=m.bytes_per_step,
            dead=r.dead, ended=r.ended, live=not r.ended, source=source)
    return out


def compute_times(figures: dict[int, RankComm]) -> dict[int, float]:
    """What `figures.slowest_rank` compares: live ranks with a window, else every rank with one."""
    live = {r: f.compute_ms for r, f in figures.items() if f.live}
    return live or {r: f.compute_ms for r, f in figures.items() if math.isfinite(f.step_ms)}


FIGURES = {"compute": lambda f: f.compute_ms, "exposed": lambda f: f.exposed_comm_ms, "idle": lambda f: f.idle_pct,
           "busbw": lambda f: -f.busbw_gbps}
"""busbw negated: its spread's max is the node's lowest bus bandwidth, the rank to look at."""


@dataclass(frozen=True, slots=True)
class CommNode:
    host: str
    ranks: tuple[int, ...]
    spreads: dict[str, Spread]
    dead: int
    ended: int


def comm_nodes(figures: dict[int, RankComm]) -> list[CommNode]:
    out = []
    for host, ranks in by_host({r: f.host for r, f in figures.items()}).items():
        fs = [figures[r] for r in ranks]
        out.append(CommNode(host, tuple(ranks), {k: spread({f.rank: get(f) for f in fs}) for k, get in FIGURES.items()},
                            dead=sum(f.dead for f in fs), ended=sum(f.ended and not f.dead for f in fs)))
    return out


def sort_comm_nodes(nodes: list[CommNode], key: str) -> list[CommNode]:
    """The node with the most compute (or exposed time) on one rank first; "rank": by first rank."""
    if key in FIGURES:
        return sorted(nodes, key=lambda n: (-n.spreads[key].max if math.isfinite(n.spreads[key].max) else math.inf,
                                            n.host))
    return sorted(nodes, key=lambda n: (n.ranks[0] if n.ranks else 0, n.host))


def sort_comm_ranks(ranks: list[int], figures: dict[int, RankComm], key: str) -> list[int]:
    if key in FIGURES:
        return ranks_by(ranks, {r: FIGURES[key](figures[r]) for r in ranks})
    return sorted(ranks)


NODE_SPEC = (
    # key, label, width, right-aligned, priority (fit_to_width: higher goes first)
    ("node", "node", 14, False, 0),
    ("ranks", "ranks", 5, True, 0),
    ("compute_min", "compute min", 11, True, 3),
    ("compute_median", "median", 8, True, 2),
    ("compute_max", "max ms", 8, True, 0),
    ("slowest", "slowest", 7, True, 0),
    ("exposed_median", "exposed med", 11, True, 4),
    ("exposed_max", "exposed max", 11, True, 5),
    ("busbw_min", "busbw min", 9, True, 6),
    ("idle", "idle% med", 9, True, 1),
    ("note", "note", 16, False, 0),
)


def node_columns(table_width: int) -> list[Column]:
    return spread_columns(NODE_SPEC, table_width)


def node_cells(n: CommNode, slowest_overall: int | None) -> dict[str, Text]:
    compute, exposed, busbw = n.spreads["compute"], n.spreads["exposed"], n.spreads["busbw"]
    style = "bold yellow" if compute.worst is not None and compute.worst == slowest_overall else ""
    return {
        "node": Text(n.host, style="bold"),
        "ranks": Text(str(len(n.ranks))),
        "compute_min": Text(fmt.ms(compute.min)),
        "compute_median": Text(fmt.ms(compute.median)),
        "compute_max": Text(fmt.ms(compute.max), style=style),
        "slowest": Text(f"r{compute.worst}" if compute.worst is not None else "-", style=style),
        "exposed_median": Text(fmt.ms(exposed.median)),
        "exposed_max": Text(fmt.ms(exposed.max)),
        "busbw_min": Text(fmt.gbps(-busbw.max)),
        "idle": Text(fmt.pct(n.spreads["idle"].median)),
        "note": state_note(n.dead, n.ended),
    }


def comm_standouts(figures: dict[int, RankComm], width: int = 0) -> Text:
    """`▲ slowest (compute): r517 node-4 126.0 ms +31% · …` and the robust outliers."""
    compute = compute_times(figures)
    mid = median(v for v in compute.values() if math.isfinite(v))

    def describe(rank: int, ms: float) -> str:
        excess = f" {100 * (ms / mid - 1):+.0f}%" if math.isfinite(mid) and mid > 0 else ""
        return f" {figures[rank].host} {fmt.ms(ms)} ms{excess}"
    found = [("compute", mad_outliers(compute, floor=TIME_FLOOR)),
             ("exposed", mad_outliers({r: figures[r].exposed_comm_ms for r in compute}, floor=TIME_FLOOR))]
    return standouts("slowest (compute/step)", top_k(compute, TOP_K), describe, "no steps yet", found, width)
