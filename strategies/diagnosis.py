"""Turns a window of per-rank step numbers into verdicts a user acts on. Pure and torch-free.

Each verdict names its evidence (the numbers that triggered it) and advice from the chapter, with
the cost model's estimate of what the advice would change where one applies. The thresholds are
deliberately loose: a healthy run on a noisy machine must produce no verdict at all.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringtop.metrics.busbw import algbw_gbps
from ringtop.metrics.outliers import STRAGGLER, Outlier, excess_pct
from ringtop.metrics.strategy_names import LESS_SHARDED
from ringtop.metrics.timing import compute_ms

from .cost_model import ModelSpec, comm_per_step

COMM_BOUND_SHARE = 0.35
"""Exposed communication above this share of the step (median over ranks) is communication-bound."""
INPUT_STALL_SHARE = 0.15
MEMORY_NEAR_FULL = 0.92


@dataclass(frozen=True)
class RankWindow:
    """Medians over the last window of steps of one rank."""

    rank: int
    step_ms: float
    data_ms: float
    blocked_ms: float
    comm_busy_ms: float = 0.0
    comm_bytes: float = 0.0
    cuda_reserved_bytes: float = 0.0
    cuda_alloc_retries: float = 0.0

    @property
    def compute_ms(self) -> float:
        return compute_ms(self.step_ms, self.blocked_ms, self.data_ms)


@dataclass(frozen=True)
class RunContext:
    strategy: str
    """Canonical cost-model name: ddp, zero1..3, fsdp-full, fsdp-grad-op, fsdp-no-shard."""
    world_size: int
    param_count: int
    param_bytes: int = 4
    grad_bytes: int = 4
    device_capacity_bytes: float = 0.0
    link_peak_gbps: float = 0.0
    """Measured (ringtop bench comm) or named link peak busbw; 0 = unknown."""


@dataclass(frozen=True)
class Verdict:
    rule: str
    """comm_bound | straggler | input_stall | memory_pressure"""
    text: str
    rank: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""


def input_stalled(w: RankWindow) -> bool:
    """Decided by each rank on its own window (the exchange sends only the ranks that are)."""
    return w.step_ms > 0 and w.data_ms / w.step_ms > INPUT_STALL_SHARE


def input_score(w: RankWindow) -> float:
    return w.data_ms / w.step_ms if w.step_ms > 0 else 0.0


def memory_short(w: RankWindow, run: RunContext) -> bool:
    near_full = run.device_capacity_bytes > 0 and w.cuda_reserved_bytes / run.device_capacity_bytes > MEMORY_NEAR_FULL
    return w.cuda_alloc_retries > 0 or near_full


def memory_score(w: RankWindow, run: RunContext) -> float:
    used = w.cuda_reserved_bytes / run.device_capacity_bytes if run.device_capacity_bytes else 0.0
    return used + w.cuda_alloc_retries


@dataclass(frozen=True)
class RunSummary:
    """What the rules need of the whole run: medians (of all ranks, or of all but one value), the
    ranks that could be stragglers (the slowest by compute), and the ranks that flagged themselves.
    Exact from every window (`summarize`), or from the ranks' sketches (agent/diagnosis_exchange.py:
    O(1) bytes per rank, medians within 1 %)."""

    ranks: int
    compute_median_without: Callable[[float], float]
    """The median compute_ms of the ranks, leaving out one rank's value."""
    blocked_median_without: Callable[[float], float]
    share_median: float
    """Median over ranks of blocked_ms / step_ms."""
    blocked_median: float
    busy_median: float
    bytes_median: float
    slowest: tuple[RankWindow, ...]
    """Straggler candidates: the slowest ranks by compute (every rank, when exact)."""
    input_flagged: tuple[RankWindow, ...] = ()
    input_flagged_count: int = 0
    memory_flagged: tuple[RankWindow, ...] = ()
    memory_flagged_count: int = 0


def _median_without(values: list[float]) -> Callable[[float], float]:
    def without(value: float) -> float:
        rest = list(values)
        rest.remove(value)
        return statistics.median(rest) if rest else float("nan")
    return without


def summarize(windows: list[RankWindow], run: RunContext) -> RunSummary:
    """The exact summary of every rank's window."""
    shares = [w.blocked_ms / w.step_ms for w in windows if w.step_ms > 0]
    flagged_input = tuple(w for w in windows if input_stalled(w))
    flagged_memory = tuple(w for w in windows if memory_short(w, run))
    return RunSummary(
        ranks=len(windows),
        compute_median_without=_median_without([w.compute_ms for w in windows]),
        blocked_median_without=_median_without([w.blocked_ms for w in windows]),
        share_median=statistics.median(shares) if shares else float("nan"),
        blocked_median=statistics.median(w.blocked_ms for w in windows),
        busy_median=statistics.median(w.comm_busy_ms for w in windows),
        bytes_median=statistics.median(w.comm_bytes for w in windows),
        slowest=tuple(windows), input_flagged=flagged_input, input_flagged_count=len(flagged_input),
        memory_flagged=flagged_memory, memory_flagged_count=len(flagged_memory))


def diagnose(windows: list[RankWindow], run: RunContext) -> list[Verdict]:
    if not windows:
        return []
    return diagnose_summary(summarize(windows, run), run)


def diagnose_summary(summary: RunSummary, run: RunContext) -> list[Verdict]:
    if summary.ranks == 0:
        return []
    verdicts: list[Verdict] = []
    stragglers = _stragglers(summary)
    verdicts += stragglers
    if not stragglers:
        verdicts += _comm_bound(summary, run)
    verdicts += _input_stalls(summary)
    verdicts += _memory_pressure(summary, run)
    return verdicts


def _stragglers(summary: RunSummary) -> list[Verdict]:
    out = []
    if summary.ranks < 2:
        return out
    for w in sorted(summary.slowest, key=lambda w: w.rank):
        others = summary.compute_median_without(w.compute_ms)
        o = Outlier(w.rank, w.compute_ms, others, excess_pct(w.compute_ms, others))
        if not o.meets(STRAGGLER):
            continue
        waiting = summary.blocked_median_without(w.blocked_ms)
        out.append(Verdict(
            rule="straggler", rank=o.rank,
            text=f"rank {o.rank} is a straggler: compute {o.value_ms:.0f} ms per step, +{o.excess_pct:.0f} % "
                 f"over the others' median {o.others_median_ms:.0f} ms; the others wait {waiting:.0f} ms per "
                 "step in collectives",
            evidence={"compute_ms": round(o.value_ms, 2), "others_compute_ms": round(o.others_median_ms, 2),
                      "others_blocked_ms": round(waiting, 2)},
            advice="check that rank's host (CPU contention, thermal throttling, a slower GPU or link); "
                   "every collective waits for the slowest rank",
        ))
    return out


def _comm_bound(summary: RunSummary, run: RunContext) -> list[Verdict]:
    share = summary.share_median
    if math.isnan(share) or share <= COMM_BOUND_SHARE:  # NaN: no rank has a step time yet
        return []
    evidence: dict[str, Any] = {"exposed_comm_share": round(share, 3), "blocked_ms": round(summary.blocked_median, 2)}
    text = f"communication-bound: {100 * share:.0f} % of each step is spent waiting on collectives"
    busy = summary.busy_median
    if run.link_peak_gbps > 0 and busy > 0:
        gbps = algbw_gbps(summary.bytes_median, busy / 1e3)
        evidence["achieved_gbps"] = round(gbps, 3)
        evidence["link_peak_gbps"] = run.link_peak_gbps
        text += f"; collectives move {gbps:.2f} GB/s, {100 * gbps / run.link_peak_gbps:.0f} % of the link's peak"
    return [Verdict(rule="comm_bound", text=text, evidence=evidence, advice=_comm_advice(run))]


def _comm_advice(run: RunContext) -> str:
    spec = ModelSpec(run.param_count, run.param_bytes, run.grad_bytes)
    tips = ["overlap communication with compute (DDP buckets, FSDP prefetch)",
            "gradient accumulation: one exchange per several micro-batches",
            "a faster link, and keep tensor parallelism inside the node"]
    alt = LESS_SHARDED.get(run.strategy)
    if alt is not None:
        now = comm_per_step(run.strategy, run.world_size, spec).sent_bytes
        then = comm_per_step(alt, run.world_size, spec).sent_bytes
        tips.insert(0, f"{alt} instead of {run.strategy} drops the backward all-gather: "
                       f"{now / 1e6:.1f} -> {then / 1e6:.1f} MB sent per rank per step (cost model)")
    elif run.strategy == "ddp":
        tips.insert(0, "larger DDP buckets (--ddp-bucket-cap-mb) mean fewer, more efficient all-reduces")
    return "; ".join(tips)


def _more(verdicts: list[Verdict], shown: int, count: int) -> list[Verdict]:
    """The last verdict says how many more ranks are alike when only the worst few were sent."""
    if verdicts and count > shown:
        last = verdicts[-1]
        verdicts[-1] = Verdict(last.rule, f"{last.text} (and {count - shown} more ranks alike)", last.rank,
                               {**last.evidence, "ranks_alike": count}, last.advice)
    return verdicts


def _input_stalls(summary: RunSummary) -> list[Verdict]:
    out = []
    for w in sorted(summary.input_flagged, key=lambda w: w.rank):
        if input_stalled(w):
            out.append(Verdict(
                rule="input_stall", rank=w.rank,
                text=f"rank {w.rank} waits on input: {w.data_ms:.0f} ms of {w.step_ms:.0f} ms per step loading data",
                evidence={"data_ms": round(w.data_ms, 2), "step_ms": round(w.step_ms, 2)},
                advice="more data-loader workers, pinned memory, prefetching, or pre-tokenised data",
            ))
    return _more(out, len(summary.input_flagged), summary.input_flagged_count)


def _memory_pressure(summary: RunSummary, run: RunContext) -> list[Verdict]:
    out = []
    for w in sorted(summary.memory_flagged, key=lambda w: w.rank):
        if memory_short(w, run):
            used = w.cuda_reserved_bytes / run.device_capacity_bytes if run.device_capacity_bytes else 0.0
            out.append(Verdict(
                rule="memory_pressure", rank=w.rank,
                text=f"rank {w.rank} is short of GPU memory: {100 * used:.0f} % reserved, "
                     f"{w.cuda_alloc_retries:.0f} allocation retries",
                evidence={"reserved_share": round(used, 3), "alloc_retries": w.cuda_alloc_retries},
                advice="shard more state (ZeRO-2/3, FSDP full), activation checkpointing, a smaller micro-batch",
            ))
    return _more(out, len(summary.memory_flagged), summary.memory_flagged_count)
