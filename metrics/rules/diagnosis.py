"""Turns a window of per-rank step numbers into verdicts a user acts on. Pure and torch-free.

Each verdict names its evidence (the numbers that triggered it) and advice from the chapter, with
the cost model's estimate of what the advice would change where one applies, in the run's own
terms (metrics/rules/advice.py: agent flags for an agent run, the settings in the script's code for
`ringtop.Monitor`, the trainer's arguments for the HF and Lightning callbacks). The thresholds are
deliberately loose: a healthy run on a noisy machine must produce no verdict at all.

The rules judge one window (the medians of a rank's last `WINDOW_STEPS` steps, every
`WINDOW_STEPS` steps). A verdict is raised after `RAISE_AFTER` consecutive windows find it and
cleared after `CLEAR_AFTER` consecutive windows do not (metrics/rules/debounce.py): K = 2 for both, so a
finding needs 40 steps of evidence. One window of noise (a GC pause, a neighbour's burst, a
checkpoint) then raises nothing and clears nothing, and a finding on the edge of its threshold,
found in every other window, is never raised; a larger K would keep a real straggler unnamed for
60 steps and more. At most one straggler per window: the slowest rank by compute
(metrics/rules/outliers.py `slowest`, the one slowest-rank rule), if it meets `STRAGGLER`. While a rank
waits on its input the others wait for it in their collectives: that wait is data wait, not
exposed communication, so the comm-bound rule reads the exposed share less the worst input-stalled
rank's data share (ranks in lockstep have equal steps); it is not read while a straggler is named.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringtop.metrics import fmt
from ringtop.metrics.costs.busbw import algbw_gbps
from ringtop.metrics.costs.cost_model import ModelSpec, comm_per_step
from ringtop.metrics.rank_sets import ranks_text
from ringtop.metrics.rules import advice
from ringtop.metrics.rules.outliers import STRAGGLER, Outlier, excess_pct, slowest
from ringtop.metrics.strategy_names import LESS_SHARDED
from ringtop.metrics.timing import compute_ms

WINDOW_STEPS = 20
"""Steps per window, and steps between two readings of the rules."""
RAISE_AFTER = 2
"""Consecutive windows that must find a verdict before it is raised (see the module)."""
CLEAR_AFTER = 2
"""Consecutive windows that must not find it before it is cleared."""

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
    exposed_comm_ms: float
    comm_busy_ms: float = 0.0
    comm_bytes: float = 0.0
    cuda_reserved_bytes: float = 0.0
    cuda_alloc_retries: float = 0.0

    @property
    def compute_ms(self) -> float:
        return compute_ms(self.step_ms, self.exposed_comm_ms, self.data_ms)


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
    loop: str = "agent"
    """What kind of run it is, for the advice's words (metrics/rules/advice.py LOOPS)."""


@dataclass(frozen=True)
class Verdict:
    rule: str
    """comm_bound | straggler | input_stall | memory_pressure"""
    text: str
    rank: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""
    ranks: tuple[int, ...] = ()
    """Every rank it is about (`rank` alone, or all of them for a run-wide verdict)."""


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
    Exact from every window (`summarize`), or from the ranks' sketches (agent/health/diagnosis_exchange.py:
    O(1) bytes per rank, medians within 1 %)."""

    ranks: int
    compute_median_without: Callable[[float], float]
    """The median compute_ms of the ranks, leaving out one rank's value."""
    exposed_comm_median_without: Callable[[float], float]
    share_median: float
    """Median over ranks of exposed_comm_ms / step_ms."""
    exposed_comm_median: float
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
    shares = [w.exposed_comm_ms / w.step_ms for w in windows if w.step_ms > 0]
    flagged_input = tuple(w for w in windows if input_stalled(w))
    flagged_memory = tuple(w for w in windows if memory_short(w, run))
    return RunSummary(
        ranks=len(windows),
        compute_median_without=_median_without([w.compute_ms for w in windows]),
        exposed_comm_median_without=_median_without([w.exposed_comm_ms for w in windows]),
        share_median=statistics.median(shares) if shares else float("nan"),
        exposed_comm_median=statistics.median(w.exposed_comm_ms for w in windows),
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
    verdicts += _input_stalls(summary, run)
    verdicts += _memory_pressure(summary, run)
    return verdicts


def _stragglers(summary: RunSummary) -> list[Verdict]:
    """The slowest rank by compute (one rule: `slowest`, the higher rank on a tie), against the
    median of all the others (exact, or from the sketch): a straggler, or none."""
    if summary.ranks < 2 or not summary.slowest:
        return []
    by_rank = {w.rank: w for w in summary.slowest}
    if len(by_rank) > 1:
        worst = slowest({r: w.compute_ms for r, w in by_rank.items()})
        if worst is None:
            return []
        w = by_rank[worst.rank]
    else:
        (w,) = by_rank.values()  # the sketch's one candidate: the slowest of all ranks
    others = summary.compute_median_without(w.compute_ms)
    o = Outlier(w.rank, w.compute_ms, others, excess_pct(w.compute_ms, others))
    if not o.meets(STRAGGLER):
        return []
    waiting = summary.exposed_comm_median_without(w.exposed_comm_ms)
    return [Verdict(
        rule="straggler", rank=o.rank, ranks=(o.rank,),
        text=f"rank {o.rank} is a straggler: compute {o.value_ms:.0f} ms per step, +{o.excess_pct:.0f} % "
             f"over the others' median {o.others_median_ms:.0f} ms; the others wait {waiting:.0f} ms per "
             "step in collectives",
        evidence={"compute_ms": round(o.value_ms, 2), "others_compute_ms": round(o.others_median_ms, 2),
                  "others_exposed_comm_ms": round(waiting, 2)},
        advice="check that rank's host (CPU contention, thermal throttling, a slower GPU or link); "
               "every collective waits for the slowest rank",
    )]


def _comm_bound(summary: RunSummary, run: RunContext) -> list[Verdict]:
    """The median exposed share of the step, less the time the ranks wait for the slowest loader
    (an input-stalled rank's data share: the others wait that long for it in the collective)."""
    stalled = [w for w in summary.input_flagged if input_stalled(w)]
    input_wait = max((input_score(w) for w in stalled), default=0.0)
    share = summary.share_median - input_wait
    if math.isnan(share) or share <= COMM_BOUND_SHARE:  # NaN: no rank has a step time yet
        return []
    evidence: dict[str, Any] = {"exposed_comm_share": round(share, 3),
                                "exposed_comm_ms": round(summary.exposed_comm_median, 2)}
    ranks = tuple(range(summary.ranks))
    text = (f"communication-bound ({ranks_text(ranks)}): {100 * share:.0f} % of each step is spent waiting on "
            "collectives")
    if stalled:
        worst = max(stalled, key=input_score)
        evidence["input_wait_share"] = round(input_wait, 3)
        text += f", beyond the {100 * input_wait:.0f} % they wait for rank {worst.rank}'s input"
    busy = summary.busy_median
    if run.link_peak_gbps > 0 and busy > 0:
        gbps = algbw_gbps(summary.bytes_median, busy / 1e3)
        evidence["achieved_gbps"] = round(gbps, 3)
        evidence["link_peak_gbps"] = run.link_peak_gbps
        text += f"; collectives move {gbps:.2f} GB/s, {100 * gbps / run.link_peak_gbps:.0f} % of the link's peak"
    return [Verdict(rule="comm_bound", text=text, evidence=evidence, advice=_comm_advice(run), ranks=ranks)]


def _comm_advice(run: RunContext) -> str:
    spec = ModelSpec(run.param_count, run.param_bytes, run.grad_bytes)
    tips = [advice.fewer_exchanges(run.loop), "a faster link, and keep tensor parallelism inside the node"]
    alt = LESS_SHARDED.get(run.strategy)
    how = advice.less_sharded_how(run.loop, alt) if alt is not None else ""
    if alt is not None and how:
        now = comm_per_step(run.strategy, run.world_size, spec).sent_bytes
        then = comm_per_step(alt, run.world_size, spec).sent_bytes
        tips.insert(0, f"{alt} instead of {run.strategy} ({how}) drops the backward all-gather: "
                       f"{fmt.nbytes(now)} -> {fmt.nbytes(then)} sent per rank per step (cost model)")
    elif run.strategy == "ddp":
        tips.insert(0, advice.buckets(run.loop))
    return "; ".join(tips)


def _more(verdicts: list[Verdict], shown: int, count: int) -> list[Verdict]:
    """The last verdict says how many more ranks are alike when only the worst few were sent."""
    if verdicts and count > shown:
        last = verdicts[-1]
        verdicts[-1] = Verdict(last.rule, f"{last.text} (and {count - shown} more ranks alike)", last.rank,
                               {**last.evidence, "ranks_alike": count}, last.advice, last.ranks)
    return verdicts


def _input_stalls(summary: RunSummary, run: RunContext) -> list[Verdict]:
    out = []
    for w in sorted(summary.input_flagged, key=lambda w: w.rank):
        if input_stalled(w):
            out.append(Verdict(
                rule="input_stall", rank=w.rank, ranks=(w.rank,),
                text=f"rank {w.rank} waits on input: {w.data_ms:.0f} ms of {w.step_ms:.0f} ms per step loading data",
                evidence={"data_ms": round(w.data_ms, 2), "step_ms": round(w.step_ms, 2)},
                advice=advice.input_stall(run.loop),
            ))
    return _more(out, len(summary.input_flagged), summary.input_flagged_count)


def _memory_pressure(summary: RunSummary, run: RunContext) -> list[Verdict]:
    out = []
    for w in sorted(summary.memory_flagged, key=lambda w: w.rank):
        if memory_short(w, run):
            used = w.cuda_reserved_bytes / run.device_capacity_bytes if run.device_capacity_bytes else 0.0
            out.append(Verdict(
                rule="memory_pressure", rank=w.rank, ranks=(w.rank,),
                text=f"rank {w.rank} is short of GPU memory: {100 * used:.0f} % reserved, "
                     f"{w.cuda_alloc_retries:.0f} allocation retries",
                evidence={"reserved_share": round(used, 3), "alloc_retries": w.cuda_alloc_retries},
                advice=advice.memory(run.loop),
            ))
    return _more(out, len(summary.memory_flagged), summary.memory_flagged_count)
