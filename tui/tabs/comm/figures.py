"""The Comm tab's figures: per collective kind over a recent window of steps, bandwidth (algbw,
busbw) against the link's peak, exposed communication and overlap. Pure Python over a `RunView`
(no Textual); the busbw factors, compute time and the slowest-rank rule come from `ringtop.metrics`.

Definitions (per rank and step, from `Step`):
- MiB/step: payload bytes handed to collectives (CommStat.bytes), 1 MiB = 2**20 bytes (sizes are binary
  everywhere; rates, MB/s and GB/s, decimal).
- algbw (GB/s, GB = 1e9 B) of a kind: its bytes / its busy time, where a kind's busy time adds each
  call's own duration (CommStat.busy_ms) — nccl-tests' per-call algbw, averaged weighted by time.
- busbw of a kind: algbw x `metrics.busbw.busbw_factor(kind, group size)` (all-reduce 2(n-1)/n, ...).
- busbw of a step (the chart, and the `all` row): bus bytes of every kind / the wall time any
  collective was in flight (Step.comm_busy_ms, the union), i.e. what the link carried while busy.
  Calls that run at once make this larger than the kinds' own figures (their times overlap).
- exposed ms: Step.exposed_comm_ms, the time the training thread waited on communication;
  overlap % = 1 - exposed / busy (union), clamped to 0..100; idle % = (data + exposed) / step.

A window aggregated over ranks sums every rank-step in it, so per-step figures are means per rank.
Where its collectives carry more than one mesh dimension (CommStat.group: a 2D run's tp and dp),
each kind is one row per dimension; the prediction, per kind, goes on a kind's row only where the
kind has one row (always on the total).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Iterable, Mapping

from ringtop.metrics.costs.busbw import busbw_factor_or_nan, rate_gbps
from ringtop.metrics.rules import outliers
from ringtop.metrics.timing import compute_ms, overlap_pct, share_pct
from ringtop.protocol import CommStat
from ringtop.tui.state.rank_row import RankRow
from ringtop.tui.state.reducers.comm import COMM_KIND_ORDER, COMM_WINDOW, CommStep, rank_step
from ringtop.tui.state.view_model import RunView


@dataclass(frozen=True, slots=True)
class KindRow:
    kind: str
    count_per_step: float
    bytes_per_step: float
    busy_ms_per_step: float
    algbw_gbps: float
    """NaN when the kind took no measurable time."""
    busbw_gbps: float
    """NaN when the cost model has no factor for the kind (or the group size is unknown)."""
    group_sizes: tuple[int, ...]
    predicted_bytes: float | None
    """Hello.prediction.comm_payload_bytes[kind] (mean over the ranks shown); None when absent."""
    measured: bool = True
    """False for a kind the prediction names but no rank counted in the window."""
    group: str = ""
    """The mesh dimension (CommStat.group) when the window's collectives ran on more than one
    (a 2D run: tp and dp): one row per (kind, group). "" on a 1D run: one row per kind."""
    link_peak_gbps: float = math.nan
    """The link its dimension runs on, where one was declared (--link-tp, --link-dp, --link-pp)."""

    @property
    def link_pct(self) -> float:
        """busbw as a share of its dimension's link (NaN: no link declared, or no time measured)."""
        return share_pct(self.busbw_gbps, self.link_peak_gbps) if self.link_peak_gbps > 0 else math.nan


@dataclass(frozen=True, slots=True)
class CommWindow:
    rank: int | None
    """The rank shown, or None for all ranks."""
    ranks: int
    """Ranks with steps in the window (set by `rank_window` / `run_window`)."""
    rank_steps: int
    """Rank-steps summed (the divisor of every per-step mean)."""
    first_step: int
    last_step: int
    kinds: list[KindRow] = field(default_factory=list)
    step_ms: float = math.nan
    data_ms: float = math.nan
    exposed_comm_ms: float = math.nan
    busy_ms: float = math.nan
    """Per step: union of in-flight collectives (0 when the agent does not send it)."""
    idle_ms: float = math.nan
    """Per step: idle time (metrics.timing.idle_ms), the Overview's idle % over this window."""
    bytes_per_step: float = math.nan
    count_per_step: float = math.nan
    kind_busy_ms: float = math.nan
    """Per step: the kinds' busy times added up (calls that overlap count twice)."""
    busbw_gbps: float = math.nan
    """Bus bytes / union busy time (kinds' added busy time when the union is not sent)."""
    predicted_bytes: float | None = None

    @property
    def overlap_pct(self) -> float:
        return overlap_pct(self.busy_ms, self.exposed_comm_ms)

    @property
    def exposed_pct(self) -> float:
        return share_pct(self.exposed_comm_ms, self.step_ms)

    @property
    def compute_ms(self) -> float:
        return compute_ms(self.step_ms, self.exposed_comm_ms, self.data_ms)

    @property
    def idle_pct(self) -> float:
        """Idle / step over the window, in percent (metrics.timing.idle_ms: in a pipeline, the bubble)."""
        return share_pct(self.idle_ms, self.step_ms)

    @property
    def empty(self) -> bool:
        return self.rank_steps == 0


def kind_sort_key(kind: str) -> tuple[int, str]:
    return (COMM_KIND_ORDER.index(kind), "") if kind in COMM_KIND_ORDER else (len(COMM_KIND_ORDER), kind)


def _predictions(rows: Iterable[RankRow]) -> dict[tuple[str, str], float] | None:
    """Mean predicted payload per (kind, mesh dimension) over the rows that carry a prediction
    (dimension "" for all of a kind where a prediction is not split by dimension); None when none
    does."""
    preds = [r.prediction for r in rows if r.prediction is not None]
    if not preds:
        return None
    kinds: dict[tuple[str, str], list[int]] = {}
    for p in preds:
        if p.comm_payload_bytes_by_group:
            for group, of_group in p.comm_payload_bytes_by_group.items():
                for k, b in of_group.items():
                    kinds.setdefault((k, group), []).append(b)
        else:
            for k, b in p.comm_payload_bytes.items():
                kinds.setdefault((k, ""), []).append(b)
    # a kind some predictions lack counts as 0 for them: the mean is over the ranks that predict
    return {k: sum(v) / len(preds) for k, v in kinds.items()}


def _of_kind(predicted: dict[tuple[str, str], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (kind, _), b in predicted.items():
        out[kind] = out.get(kind, 0.0) + b
    return out


@dataclass(frozen=True, slots=True)
class WindowMeans:
    """A window's sums as per-step means: made once, by `window_means`, for the Comm tab's window
    and for each rank of a large run's table alike, so both show the same numbers."""

    rank_steps: int
    step_ms: float
    data_ms: float
    exposed_comm_ms: float
    busy_ms: float
    idle_ms: float
    bytes_per_step: float
    count_per_step: float
    kind_busy_ms: float
    """The kinds' busy times added up (calls that overlap count twice)."""
    busbw_gbps: float
    """Bus bytes / union busy time (the kinds' added busy time when the union is not sent)."""


def window_means(total: CommStep, world_size: int) -> WindowMeans | None:
    """`total` (CommSteps or timed steps summed, `CommStep.add` / `add_timed`) per step; None for
    an empty window. A call's bus bytes use its kind's factor for its group (the world without one)."""
    n = total.ranks
    if not n:
        return None
    bus = kind_busy = 0.0
    nbytes = count = 0
    for (kind, group, _), c in total.kinds.items():
        bus += c.bytes * busbw_factor_or_nan(kind, group or world_size)
        kind_busy += c.busy_ms
        nbytes += c.bytes
        count += c.count
    return WindowMeans(
        rank_steps=n, step_ms=total.step_ms / n, data_ms=total.data_ms / n, exposed_comm_ms=total.exposed_comm_ms / n,
        busy_ms=total.busy_ms / n, idle_ms=total.idle_ms / n, bytes_per_step=nbytes / n, count_per_step=count / n,
        kind_busy_ms=kind_busy / n, busbw_gbps=rate_gbps(bus, total.busy_ms if total.busy_ms > 0 else kind_busy))


def summarize(samples: Iterable[CommStep], *, rank: int | None, world_size: int,
              predicted: dict[tuple[str, str], float] | None,
              link_peaks: dict[str, float] | None = None) -> CommWindow:
    """Sum the CommSteps of a window and turn them into per-step means and rates. `predicted`:
    payload per (kind, mesh dimension), `_predictions`; `link_peaks`: GB/s per mesh dimension."""
    total = CommStep(step=-1)
    first, last = math.inf, -math.inf
    for s in samples:
        total.add(s)
        first, last = min(first, s.step), max(last, s.step)
    n = total.ranks
    split = len({dim for (_, _, dim) in total.kinds}) > 1
    per_kind: dict[tuple[str, str], CommStat] = {}
    bus_bytes: dict[tuple[str, str], float] = {}
    groups: dict[tuple[str, str], set[int]] = {}
    for (kind, group, dim), c in total.kinds.items():
        ranks = group or world_size
        key = (kind, dim if split else "")
        per_kind.setdefault(key, CommStat(kind=kind)).add(c)
        bus_bytes[key] = bus_bytes.get(key, 0.0) + c.bytes * busbw_factor_or_nan(kind, ranks)
        groups.setdefault(key, set()).add(ranks)
    rows_of_kind: dict[str, int] = {}
    for kind, _ in per_kind:
        rows_of_kind[kind] = rows_of_kind.get(kind, 0) + 1
    # the prediction per (kind, dimension) where it is split so and the window is too; else per kind,
    # held against a row only where the kind has one row
    by_dim = split and predicted is not None and any(dim for _, dim in predicted)
    of_kind = _of_kind(predicted or {})
    rows: list[KindRow] = []
    for key in sorted(per_kind, key=lambda k: (kind_sort_key(k[0]), k[1])):
        kind, dim = key
        c = per_kind[key]
        if predicted is None:
            expected = None
        elif by_dim:
            expected = predicted.get(key)
        else:
            expected = None if rows_of_kind[kind] > 1 else of_kind.get(kind)
        rows.append(KindRow(
            kind=kind, count_per_step=c.count / n, bytes_per_step=c.bytes / n, busy_ms_per_step=c.busy_ms / n,
            algbw_gbps=rate_gbps(c.bytes, c.busy_ms), busbw_gbps=rate_gbps(bus_bytes[key], c.busy_ms),
            group_sizes=tuple(sorted(groups[key])), predicted_bytes=expected, group=dim,
            link_peak_gbps=(link_peaks or {}).get(dim, math.nan) if dim else math.nan))
    if predicted is not None and n:
        missing = (set(predicted) - set(per_kind)) if by_dim else {(k, "") for k in set(of_kind) - set(rows_of_kind)}
        for kind, dim in sorted(missing, key=lambda k: (kind_sort_key(k[0]), k[1])):
            rows.append(KindRow(kind=kind, count_per_step=0.0, bytes_per_step=0.0, busy_ms_per_step=0.0,
                                algbw_gbps=math.nan, busbw_gbps=math.nan, group_sizes=(),
                                predicted_bytes=predicted[(kind, dim)] if by_dim else of_kind[kind],
                                measured=False, group=dim))
    m = window_means(total, world_size)
    if m is None:
        return CommWindow(rank=rank, ranks=0, rank_steps=0, first_step=-1, last_step=-1, kinds=rows,
                          predicted_bytes=None if predicted is None else sum(predicted.values()))
    return CommWindow(
        rank=rank, ranks=0, rank_steps=n, first_step=int(first), last_step=int(last), kinds=rows,
        step_ms=m.step_ms, data_ms=m.data_ms, exposed_comm_ms=m.exposed_comm_ms, busy_ms=m.busy_ms,
        idle_ms=m.idle_ms, bytes_per_step=m.bytes_per_step, count_per_step=m.count_per_step,
        kind_busy_ms=m.kind_busy_ms, busbw_gbps=m.busbw_gbps,
        predicted_bytes=None if predicted is None else sum(predicted.values()))


def rank_window(view: RunView, rank: int, window: int = COMM_WINDOW) -> CommWindow:
    """One rank's last `window` steps."""
    row = view.ranks.get(rank)
    if row is None:
        return summarize((), rank=rank, world_size=view.facts.world_size, predicted=None)
    samples = [rank_step(m) for m in islice(reversed(row.comm_history), window)][::-1]
    w = summarize(samples, rank=rank, world_size=view.facts.world_size, predicted=_predictions([row]),
                  link_peaks=view.facts.link_peaks_by_group)
    return _with_ranks(w, 1 if samples else 0)


def run_window(view: RunView, window: int = COMM_WINDOW) -> CommWindow:
    """The last `window` step numbers, summed over every rank that reported them."""
    steps = sorted(view.comm_steps)[-window:]
    samples = [view.comm_steps[s] for s in steps]
    w = summarize(samples, rank=None, world_size=view.facts.world_size, predicted=_predictions(view.ranks.values()),
                  link_peaks=view.facts.link_peaks_by_group)
    ranks = sum(1 for r in view.ranks.values() if steps and r.comm_history and r.comm_history[-1].step >= steps[0])
    return _with_ranks(w, ranks)


def _with_ranks(w: CommWindow, ranks: int) -> CommWindow:
    return replace(w, ranks=ranks)


def comm_window(view: RunView, rank: int | None = None, window: int = COMM_WINDOW) -> CommWindow:
    return run_window(view, window) if rank is None else rank_window(view, rank, window)


@dataclass(frozen=True, slots=True)
class SlowestRank:
    """The rank with the most compute per step in the window. Ranks in lockstep have equal step
    times (every collective waits for the last to arrive), so compute — step minus exposed
    communication and data time — is what tells the slow rank: it arrives last, the others wait."""

    rank: int
    compute_ms: float
    others_median_ms: float
    excess_pct: float


def slowest_rank(view: RunView, window: int = COMM_WINDOW,
                 compute: Mapping[int, float] | None = None) -> SlowestRank | None:
    """The view's one slowest rank (RunView.slowest: by compute per step over the window; live
    ranks, all once every one has ended), the one the Overview marks; None with fewer than two
    ranks, or when none is `outliers.SLOWEST_SHOWN` above the others' median. `compute`: the same
    ranks' compute times when the caller has them (a large run's figures, `scale.compute_times`);
    another `window` compares that window's."""
    if compute is not None:
        found = outliers.slowest(compute)
    elif window == COMM_WINDOW:
        found = view.slowest
    else:
        rows = [r for r in view.ranks.values() if not r.ended and r.comm_history] or \
            [r for r in view.ranks.values() if r.comm_history]
        found = outliers.slowest({r.rank: rank_window(view, r.rank, window).compute_ms for r in rows})
    if found is None or not found.meets(outliers.SLOWEST_SHOWN):
        return None
    return SlowestRank(found.rank, found.value_ms, found.others_median_ms, found.excess_pct)


def step_busbw_gbps(s: CommStep, world_size: int) -> float:
    """busbw of one CommStep: bus bytes of every kind / union busy time (kinds' time if no union)."""
    bus = sum(c.bytes * busbw_factor_or_nan(kind, group or world_size) for (kind, group, _), c in s.kinds.items())
    busy = s.busy_ms if s.busy_ms > 0 else sum(c.busy_ms for c in s.kinds.values())
    return rate_gbps(bus, busy)


def busbw_series(view: RunView, rank: int | None = None) -> list[float]:
    """busbw per step, oldest first: one rank's, or over all ranks (bus bytes and busy time summed
    per step number). Steps without collectives are left out."""
    if rank is None:
        samples = [view.comm_steps[s] for s in sorted(view.comm_steps)]
    else:
        row = view.ranks.get(rank)
        samples = [rank_step(m) for m in row.comm_history] if row is not None else []
    out = []
    for s in samples:
        x = step_busbw_gbps(s, view.facts.world_size)
        if math.isfinite(x):
            out.append(x)
    return out


@dataclass(frozen=True, slots=True)
class PeakRef:
    """What busbw is held against: the link's peak when known, else the highest busbw seen."""

    gbps: float
    known: bool
    source: str

    def pct(self, gbps: float) -> float:
        return 100.0 * gbps / self.gbps if self.gbps > 0 and math.isfinite(gbps) else math.nan


def peak_ref(view: RunView, series: list[float]) -> PeakRef:
    """The link's peak (`RunView.link_peak_gbps`, the hook) or, unknown, the measured maximum."""
    if view.link_peak_gbps > 0:
        return PeakRef(view.link_peak_gbps, True, view.link_peak_source)
    finite = [x for x in series if math.isfinite(x)]
    return PeakRef(max(finite) if finite else math.nan, False, "max seen")
