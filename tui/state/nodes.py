"""The ranks of a large run folded per node (host, from Hello.host), and the ranks' own figures that
the node rows, the heat strip and the outlier lines share — read once per repaint.

Pure: no Textual. Each figure is one number per rank, so a node row is a min / median / max over
its ranks, and a rank's own row (a node opened) is read from the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ringtop.metrics.costs.flops import mfu
from ringtop.metrics.rank_sets import group_members
from ringtop.metrics.rules.outliers import median
from ringtop.tui.state.marks import FLAGGED, HUNG, rank_marks
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.view_model import RunView

SORT_KEYS = ("step", "mem", "idle", "rank")
"""What `o` cycles through: slowest step first, most memory first, most idle first, rank order."""
MEMORY_SORT_KEYS = ("mem", "state", "rank")
"""The Memory tab's: most memory (allocated / RSS) first, most state first, rank order."""
COMM_SORT_KEYS = ("compute", "exposed", "rank")
"""The Comm tab's: most compute per step (the rank the others wait for) first, most exposed
communication first, rank order."""
SORT_LABELS = {"step": "step time", "mem": "memory", "idle": "idle share", "rank": "rank", "state": "state",
               "compute": "compute", "exposed": "exposed comm"}
UNKNOWN_HOST = "?"


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank's numbers for comparing it with the others (NaN / 0 when it has none)."""

    rank: int
    host: str
    step_ms: float
    """Mean of its recent steps (SLOWEST_WINDOW), NaN before its first or once it ended."""
    mem_bytes: int
    idle_pct: float
    comm_pct: float
    dead: bool
    ended: bool
    hung: bool
    """It holds the others up: a culprit of the view's hang verdict (metrics/rules/hang.py)."""
    silent: bool = False
    """Live, yet nothing of it (not even a heartbeat) arrived for the view's stale_after_s."""
    tflops: float = 0.0
    """Achieved TFLOP/s of its latest step while live; 0 = not known."""
    peak_tflops: float = 0.0
    """Its device's dense peak (its Hello); 0 = not known."""
    cut_off: bool = False
    """On a host the UI hears nothing from while it hears others (RunView.cut_off_hosts)."""
    flagged: bool = False
    """An active verdict names it (a straggler, an input stall, ...): tui/state/marks.py."""

    @property
    def trouble(self) -> int:
        """0: dead, hung or cut off; 1: silent or flagged; 2: none. Rows sort by it first."""
        return 0 if self.dead or self.hung or self.cut_off else 1 if self.silent or self.flagged else 2


@dataclass(frozen=True, slots=True)
class NodeSummary:
    host: str
    ranks: tuple[int, ...]
    step_min_ms: float
    step_median_ms: float
    step_max_ms: float
    slowest_rank: int | None
    """The rank of the node with the longest recent step: the one to look at."""
    mem_max_bytes: int
    idle_median_pct: float
    comm_median_pct: float
    dead: int
    ended: int
    hung: int
    silent: int = 0
    unreachable: bool = False
    """Cut off: the UI hears none of its ranks while it hears other nodes'."""
    tflops: float = 0.0
    """Its live ranks' achieved TFLOP/s, summed; 0 = not known."""
    mfu: float | None = None
    """Its TFLOP/s over its live ranks' summed peaks (metrics/flops.mfu); None unless each has one."""
    flagged: int = 0
    marked: tuple[int, ...] = ()
    """Its dead, hung and flagged ranks (at most a few), named in its note."""

    @property
    def trouble(self) -> int:
        """As RankFigures.trouble, of its worst rank: a node in trouble sorts first in every order."""
        return 0 if self.dead or self.hung or self.unreachable else 1 if self.silent or self.flagged else 2


@dataclass(frozen=True, slots=True)
class CutOff:
    """A node the UI hears nothing from while it hears the others."""

    host: str
    ranks: tuple[int, ...]
    silent_s: float
    """The shortest silence of its ranks: how long at least the node has been cut off."""


def is_silent(view: RunView, r: RankRow) -> bool:
    return view.watch_liveness and not r.ended and not r.dead and r.silent_s > view.stale_after_s


def nodes_cut_off(view: RunView) -> list[CutOff]:
    """The hosts the view found cut off at its last tick (RunView._hosts_cut_off), with their ranks."""
    if not view.cut_off_hosts:
        return []
    hosts: dict[str, list[RankRow]] = {h: [] for h in view.cut_off_hosts}
    for r in view.ranks.values():
        if r.host in hosts and not r.ended and not r.dead:
            hosts[r.host].append(r)
    return [CutOff(h, tuple(sorted(r.rank for r in rows)), min(r.silent_s for r in rows))
            for h, rows in sorted(hosts.items()) if rows]


@dataclass(frozen=True, slots=True)
class Spread:
    """One figure over a node's ranks: what its row shows, and the rank that holds its maximum."""

    min: float
    median: float
    max: float
    worst: int | None
    """The rank with the largest value (the lower rank on a tie); None when no rank has one."""


def spread(values: Mapping[int, float]) -> Spread:
    """Min / median / max of the finite values, and the rank of the max."""
    finite = {r: v for r, v in values.items() if math.isfinite(v)}
    if not finite:
        return Spread(math.nan, math.nan, math.nan, None)
    worst = max(finite, key=lambda r: (finite[r], -r))
    return Spread(min(finite.values()), median(finite.values()), finite[worst], worst)


def by_host(hosts: Mapping[int, str]) -> dict[str, list[int]]:
    """rank -> host folded into host -> its ranks, hosts and ranks in order."""
    out: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        out.setdefault(hosts[rank], []).append(rank)
    return {h: out[h] for h in sorted(out)}


def ranks_by(ranks: list[int], values: Mapping[int, float]) -> list[int]:
    """Largest value first (NaN last), then rank order."""
    return sorted(ranks, key=lambda r: (_desc(values.get(r, math.nan)), r))


def rank_figures(view: RunView) -> dict[int, RankFigures]:
    marks = rank_marks(view)
    culprits = frozenset(r for r, m in marks.items() if m.severity == HUNG)
    flagged = frozenset(r for r, m in marks.items() if m.severity == FLAGGED)
    out = {}
    for r in view.ranks.values():
        live = not r.ended and not r.dead
        out[r.rank] = RankFigures(
            rank=r.rank, host=r.host or UNKNOWN_HOST,
            step_ms=r.recent_step_ms() if live else math.nan,
            mem_bytes=r.mem_bytes, idle_pct=r.window_idle_pct if live else math.nan,
            comm_pct=r.comm_share_pct if live else math.nan,
            dead=r.dead, ended=r.ended, hung=r.rank in culprits, silent=is_silent(view, r),
            tflops=r.tflops if live else 0.0, peak_tflops=r.peak_tflops, cut_off=r.host in view.cut_off_hosts,
            flagged=r.rank in flagged)
    return out


def _finite(xs) -> list[float]:
    return [x for x in xs if math.isfinite(x)]


def node_summaries(figures: dict[int, RankFigures]) -> list[NodeSummary]:
    """One summary per host, in host order."""
    by_host: dict[str, list[RankFigures]] = {}
    for f in figures.values():
        by_host.setdefault(f.host, []).append(f)
    out = []
    for host in sorted(by_host):
        fs = sorted(by_host[host], key=lambda f: f.rank)
        step = spread({f.rank: f.step_ms for f in fs})
        working = [f for f in fs if f.tflops > 0]
        tflops = sum(f.tflops for f in working)
        peaks = [f.peak_tflops for f in working]
        out.append(NodeSummary(
            host=host, ranks=tuple(f.rank for f in fs),
            step_min_ms=step.min, step_median_ms=step.median, step_max_ms=step.max, slowest_rank=step.worst,
            mem_max_bytes=max((f.mem_bytes for f in fs), default=0),
            idle_median_pct=median(_finite(f.idle_pct for f in fs)),
            comm_median_pct=median(_finite(f.comm_pct for f in fs)),
            dead=sum(f.dead for f in fs), ended=sum(f.ended and not f.dead for f in fs),
            hung=sum(f.hung for f in fs), silent=sum(f.silent for f in fs), unreachable=any(f.cut_off for f in fs),
            tflops=tflops, mfu=mfu(tflops, sum(peaks)) if working and all(p > 0 for p in peaks) else None,
            flagged=sum(f.flagged for f in fs), marked=tuple(f.rank for f in fs if f.trouble == 0 or f.flagged)[:4]))
    return out


def _desc(x: float) -> float:
    """Largest first, NaN (no figure) last."""
    return -x if math.isfinite(x) else math.inf


def sort_nodes(nodes: list[NodeSummary], key: str) -> list[NodeSummary]:
    """Nodes in the order `key` asks (SORT_KEYS); "step" puts the node with the slowest rank first.
    In every order a node with a dead, hung or cut-off rank comes first, then one with a silent or
    flagged rank: a hung rank's steps look like anyone's."""
    if key == "step":
        return sorted(nodes, key=lambda n: (n.trouble, _desc(n.step_max_ms), n.host))
    if key == "mem":
        return sorted(nodes, key=lambda n: (n.trouble, -n.mem_max_bytes, n.host))
    if key == "idle":
        return sorted(nodes, key=lambda n: (n.trouble, _desc(n.idle_median_pct), n.host))
    return sorted(nodes, key=lambda n: (n.trouble, n.ranks[0] if n.ranks else 0, n.host))


def sort_ranks(ranks: list[int], figures: dict[int, RankFigures], key: str) -> list[int]:
    """A node's (or a filter's) ranks in the order `key` asks, those in trouble first (sort_nodes)."""
    if key == "step":
        return sorted(ranks, key=lambda r: (figures[r].trouble, _desc(figures[r].step_ms), r))
    if key == "mem":
        return sorted(ranks, key=lambda r: (figures[r].trouble, -figures[r].mem_bytes, r))
    if key == "idle":
        return sorted(ranks, key=lambda r: (figures[r].trouble, _desc(figures[r].idle_pct), r))
    return sorted(ranks, key=lambda r: (figures[r].trouble, r))


def filter_ranks(text: str, rows: list[RankRow], world_size: int) -> list[int]:
    """The ranks a filter names: a rank set (`517`, `0-15`, `0-1023/128`, `1,5,9`), else the ranks
    whose host contains the text (case-insensitive)."""
    text = text.strip()
    if not text:
        return [r.rank for r in rows]
    members = group_members(text, max(world_size, max((r.rank for r in rows), default=0) + 1))
    if members is not None:
        return sorted(r.rank for r in rows if r.rank in members)
    needle = text.lower()
    return sorted(r.rank for r in rows if needle in (r.host or UNKNOWN_HOST).lower())
