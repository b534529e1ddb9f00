"""Pipeline schedules as arithmetic: theory, a replay of the schedule with measured costs, and the
bubble measured from real per-micro-batch events. Torch-free (stdlib only), so the UI can use it.

Three views of the same idle time, from the most ideal to the real one:

1. **Theory** (`theoretical_bubble`): equal stages, free communication. GPipe idles
   (N-1)/(N+M-1) of a step; 1F1B reorders the same work (a forward and a backward alternate once
   the pipeline is full) and, for equal stages, idles exactly as long - its gain is activation
   memory (at most N-s micro-batches in flight on stage s instead of M), not the bubble.
2. **Replay** (`replay_schedule`): the schedule's own order of operations per stage, run with
   per-stage forward/backward times (they may differ: imbalance) and a per-transfer point-to-point
   time. With equal stages and free transfers it reproduces the theory exactly; with the measured
   per-stage times it predicts what the schedule plus imbalance plus transfers should cost.
3. **Measured** (`measured_bubble`, `stage_times`): 1 - busy / step time per stage from the
   (stage, micro_batch, "F"|"B", start_ms, end_ms) events a real run records.

`explain_bubble` (`pipeline_bubble.py`) lines them up: how much idle time the schedule causes, how
much stage imbalance adds, how much the transfers add, how much the per-op overhead (issuing sends
and receives, the schedule's Python) adds, and what is left unexplained.

Op order per stage follows torch.distributed.pipelining: GPipe runs F0..F(M-1) then B0..B(M-1);
1F1B runs min(M, N-s) warm-up forwards on stage s, then alternates B, F, then the remaining Bs.
Times are in milliseconds; a stage runs one operation at a time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ringtop.metrics.costs.cost_model import gpipe_bubble_fraction, one_f_one_b_bubble_fraction

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")
FORWARD, BACKWARD = "F", "B"


def check_schedule(schedule: str) -> str:
    """The canonical schedule name ("gpipe" or "1f1b"), or ValueError."""
    key = str(schedule).strip().lower().replace("-", "").replace("_", "")
    key = {"onefoneb": "1f1b", "gpipe": "gpipe", "1f1b": "1f1b"}.get(key, key)
    if key not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    return key


def _check_sizes(stages: int, micro_batches: int) -> None:
    if not isinstance(stages, int) or not isinstance(micro_batches, int) or stages < 1 or micro_batches < 1:
        raise ValueError(f"stages and micro-batches must be integers >= 1, got {stages!r} and {micro_batches!r}")


# ---------------------------------------------------------------- theory


def theoretical_bubble(schedule: str, stages: int, micro_batches: int) -> float:
    """Idle share of a step with equal stages and free communication: (N-1)/(N+M-1) for GPipe and,
    for equal stages, the same fraction for 1F1B (see the module docstring)."""
    _check_sizes(stages, micro_batches)
    if check_schedule(schedule) == "gpipe":
        return gpipe_bubble_fraction(stages, micro_batches)
    return one_f_one_b_bubble_fraction(stages, micro_batches)


def theoretical_makespan_ms(stages: int, micro_batches: int, forward_ms: float, backward_ms: float) -> float:
    """Step time of either schedule with equal stages, free transfers: (N+M-1) x (f+b)."""
    _check_sizes(stages, micro_batches)
    return (stages + micro_batches - 1) * (forward_ms + backward_ms)


# ---------------------------------------------------------------- layer split


def balanced_split(n_layers: int, stages: int) -> list[int]:
    """Layers per stage, as even as possible; the first stages take the remainder (the last stage
    already carries the output head and the loss)."""
    if stages < 1 or n_layers < stages:
        raise ValueError(f"cannot split {n_layers} layers into {stages} stages of at least one layer each")
    base, extra = divmod(n_layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]


def check_split(split: Sequence[int], n_layers: int, stages: int) -> list[int]:
    """A user's layers-per-stage list, validated: one entry per stage, each >= 1, summing to the model's layers."""
    values = list(split)
    if len(values) != stages:
        raise ValueError(f"split {values} has {len(values)} entries; the pipeline has {stages} stages")
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise ValueError(f"split {values}: every stage needs a whole number >= 1 of layers")
    if sum(values) != n_layers:
        raise ValueError(f"split {values} covers {sum(values)} layers; the model has {n_layers}")
    return values


def stage_layers(split: Sequence[int]) -> list[range]:
    """The layer indices each stage holds, from layers-per-stage."""
    out, first = [], 0
    for count in split:
        out.append(range(first, first + count))
        first += count
    return out


# ---------------------------------------------------------------- schedule order


def stage_order(schedule: str, stages: int, micro_batches: int, stage: int) -> list[tuple[int, str]]:
    """(micro_batch, "F"|"B") in the order `stage` runs them under `schedule` (torch's order)."""
    _check_sizes(stages, micro_batches)
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in [0, {stages}), got {stage}")
    m = micro_batches
    if check_schedule(schedule) == "gpipe":
        return [(i, FORWARD) for i in range(m)] + [(i, BACKWARD) for i in range(m)]
    warmup = min(m, stages - stage)
    order = [(i, FORWARD) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(i, BACKWARD), (warmup + i, FORWARD)]
    order += [(i, BACKWARD) for i in range(m - warmup, m)]
    return order


# ---------------------------------------------------------------- replay


class ScheduledOp(NamedTuple):
    micro_batch: int
    kind: str  # "F" or "B"
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class ScheduleReplay:
    schedule: str
    stages: int
    micro_batches: int
    timeline: tuple[tuple[ScheduledOp, ...], ...]
    """Per stage, its operations in the order run."""
    makespan_ms: float
    busy_ms: tuple[float, ...]
    bubble: tuple[float, ...]
    """Per stage: 1 - busy / makespan."""

    @property
    def pipeline_bubble(self) -> float:
        """Idle share of the whole pipeline: 1 - sum(busy) / (N x makespan)."""
        if self.makespan_ms <= 0:
            return 0.0
        return 1.0 - sum(self.busy_ms) / (self.stages * self.makespan_ms)


def _per_stage(value: float | Sequence, stages: int, name: str) -> list:
    if isinstance(value, (int, float)):
        return [float(value)] * stages
    values = list(value)
    if len(values) != stages:
        raise ValueError(f"{name} has {len(values)} entries; the pipeline has {stages} stages")
    return values


def _duration(per_stage: list, stage: int, micro_batch: int, name: str) -> float:
    value = per_stage[stage]
    if not isinstance(value, (int, float)):  # per micro-batch times for this stage
        value = list(value)[micro_batch]
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


def replay_schedule(schedule: str, stages: int, micro_batches: int, forward_ms: float | Sequence,
                    backward_ms: float | Sequence, p2p_ms: float = 0.0, overhead_ms: float = 0.0) -> ScheduleReplay:
    """Run the schedule's per-stage order with the given costs, each op as early as its inputs allow.

    `forward_ms` / `backward_ms`: one number for every stage, one per stage, or per stage a list of
    one time per micro-batch. `p2p_ms`: the time of one activation or gradient transfer between
    neighbouring stages. `overhead_ms`: idle time a stage spends before each op even when its input
    is there (issuing sends and receives, Python); 0 in the theory. Dependencies: F(m) on stage s
    starts after F(m) on s-1 ended + p2p; B(m) on s after B(m) on s+1 ended + p2p and after F(m) on
    s (the last stage's loss is part of its F); a stage runs its ops one at a time in the
    schedule's order.
    """
    key = check_schedule(schedule)
    _check_sizes(stages, micro_batches)
    for name, value in (("p2p_ms", p2p_ms), ("overhead_ms", overhead_ms)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    fwd = _per_stage(forward_ms, stages, "forward_ms")
    bwd = _per_stage(backward_ms, stages, "backward_ms")
    orders = [stage_order(key, stages, micro_batches, s) for s in range(stages)]
    next_op = [0] * stages
    free_ms = [0.0] * stages
    ended: dict[tuple[int, int, str], float] = {}
    timeline: list[list[ScheduledOp]] = [[] for _ in range(stages)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            while next_op[s] < len(orders[s]):
                mb, kind = orders[s][next_op[s]]
                if kind == FORWARD:
                    if s == 0:
                        ready = 0.0
                    elif (s - 1, mb, FORWARD) in ended:
                        ready = ended[(s - 1, mb, FORWARD)] + p2p_ms
                    else:
                        break
                    duration = _duration(fwd, s, mb, "forward_ms")
                else:
                    if (s, mb, FORWARD) not in ended:
                        raise ValueError(f"{key}: stage {s} runs B{mb} before F{mb}")
                    ready = ended[(s, mb, FORWARD)]
                    if s < stages - 1:
                        if (s + 1, mb, BACKWARD) not in ended:
                            break
                        ready = max(ready, ended[(s + 1, mb, BACKWARD)] + p2p_ms)
                    duration = _duration(bwd, s, mb, "backward_ms")
                start = max(free_ms[s] + overhead_ms, ready)
                end = start + duration
                ended[(s, mb, kind)] = free_ms[s] = end
                timeline[s].append(ScheduledOp(mb, kind, start, end))
                next_op[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"{key} with {stages} stages and {micro_batches} micro-batches deadlocks")
    makespan = max(free_ms)
    busy = tuple(sum(op.end_ms - op.start_ms for op in ops) for ops in timeline)
    bubble = tuple((1.0 - b / makespan) if makespan > 0 else 0.0 for b in busy)
    return ScheduleReplay(key, stages, micro_batches, tuple(tuple(ops) for ops in timeline), makespan, busy, bubble)


# ---------------------------------------------------------------- measured


class StageEvent(NamedTuple):
    """One forward or backward of one micro-batch on one stage, as a run records it."""

    stage: int
    micro_batch: int
    kind: str  # "F" or "B"
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class StageTimes:
    stage: int
    window_ms: float
    """The step time the bubble is measured against."""
    busy_ms: float
    forward_ms: float
    backward_ms: float
    wait_recv_ms: float
    """Idle gaps right before an op that needs data from a neighbour (F on stages > 0, B on all but
    the last): time blocked on the previous/next stage plus the transfer."""
    idle_ms: float
    """window - busy: every gap, including the fill/drain ends of the step."""
    bubble: float
    """1 - busy / window."""
    ops: int


def stage_events(events: Iterable) -> list[StageEvent]:
    """The events as checked StageEvents (a tuple each is taken in StageEvent's order)."""
    out = []
    for e in events:
        ev = e if isinstance(e, StageEvent) else StageEvent(*e)
        if ev.kind not in (FORWARD, BACKWARD):
            raise ValueError(f"event kind must be 'F' or 'B', got {ev.kind!r}")
        if ev.end_ms < ev.start_ms:
            raise ValueError(f"event ends before it starts: {ev}")
        out.append(StageEvent(int(ev.stage), int(ev.micro_batch), ev.kind, float(ev.start_ms), float(ev.end_ms)))
    return out


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _windows(evs: list[StageEvent], window_ms) -> dict[int, tuple[float, float]]:
    """Per stage (start, end) of the step the bubble is measured against."""
    stages = sorted({e.stage for e in evs})
    first = min(e.start_ms for e in evs)
    last = max(e.end_ms for e in evs)
    out = {}
    for s in stages:
        own = [e for e in evs if e.stage == s]
        if window_ms is None:  # the pipeline's span: from the first op anywhere to the last
            out[s] = (first, last)
        else:
            given = window_ms.get(s) if isinstance(window_ms, Mapping) else window_ms
            if given is None:
                out[s] = (first, last)
            elif isinstance(given, (int, float)):  # a duration, starting at this stage's first op
                start = min(e.start_ms for e in own)
                out[s] = (start, start + float(given))
            else:
                out[s] = (float(given[0]), float(given[1]))
    return out


def stage_times(events: Iterable, window_ms: float | Mapping | tuple | None = None,
                stages: int | None = None) -> dict[int, StageTimes]:
    """Busy, forward, backward, wait-to-receive and idle time per stage, and the bubble.

    `window_ms`: None measures every stage against the pipeline's span (first op start to last op
    end over all stages; clocks must be comparable, as on one host); a number is the step time of
    every stage (from its first op); a (start_ms, end_ms) pair is the window itself; a mapping gives
    either per stage. `stages` (for wait classification) defaults to the highest stage seen + 1.
    """
    evs = stage_events(events)
    if not evs:
        return {}
    n = stages if stages is not None else max(e.stage for e in evs) + 1
    windows = _windows(evs, window_ms)
    out = {}
    for s, (w0, w1) in windows.items():
        own = sorted((e for e in evs if e.stage == s), key=lambda e: e.start_ms)
        window = max(w1 - w0, 0.0)
        busy = _union_ms([(max(e.start_ms, w0), min(e.end_ms, w1)) for e in own if e.end_ms > w0 and e.start_ms < w1])
        wait = 0.0
        prev_end = w0
        for e in own:
            gap = e.start_ms - prev_end
            needs_recv = (e.kind == FORWARD and s > 0) or (e.kind == BACKWARD and s < n - 1)
            if gap > 0 and needs_recv:
                wait += gap
            prev_end = max(prev_end, e.end_ms)
        out[s] = StageTimes(
            stage=s, window_ms=window, busy_ms=busy,
            forward_ms=sum(e.end_ms - e.start_ms for e in own if e.kind == FORWARD),
            backward_ms=sum(e.end_ms - e.start_ms for e in own if e.kind == BACKWARD),
            wait_recv_ms=wait, idle_ms=max(window - busy, 0.0),
            bubble=(1.0 - busy / window) if window > 0 else 0.0, ops=len(own),
        )
    return out


def measured_bubble(events: Iterable, window_ms: float | Mapping | tuple | None = None) -> dict[int, float]:
    """Per stage, 1 - busy / step time, from (stage, micro_batch, "F"|"B", start_ms, end_ms) events.
    `window_ms` as in `stage_times` (None: the pipeline's span over all stages)."""
    return {s: t.bubble for s, t in stage_times(events, window_ms).items()}


def mean_op_ms(events: Iterable, stages: int) -> tuple[list[float], list[float]]:
    """Per stage, the mean forward and the mean backward time of one micro-batch."""
    evs = stage_events(events)
    fwd, bwd = [], []
    for s in range(stages):
        f = [e.end_ms - e.start_ms for e in evs if e.stage == s and e.kind == FORWARD]
        b = [e.end_ms - e.start_ms for e in evs if e.stage == s and e.kind == BACKWARD]
        if not f or not b:
            raise ValueError(f"no forward or no backward events for stage {s}")
        fwd.append(sum(f) / len(f))
        bwd.append(sum(b) / len(b))
    return fwd, bwd


def _handoffs(evs: list[StageEvent]):
    """For each op that needs a neighbour's output: (op, the neighbour's op, end of the stage's previous op)."""
    by_key = {(e.stage, e.micro_batch, e.kind): e for e in evs}
    last = max(e.stage for e in evs)
    out = []
    for s in {e.stage for e in evs}:
        own = sorted((e for e in evs if e.stage == s), key=lambda e: e.start_ms)
        for i, e in enumerate(own):
            prev_end = own[i - 1].end_ms if i else None
            if e.kind == FORWARD and e.stage > 0:
                src = by_key.get((e.stage - 1, e.micro_batch, FORWARD))
            elif e.kind == BACKWARD and e.stage < last:
                src = by_key.get((e.stage + 1, e.micro_batch, BACKWARD))
            else:
                src = None
            out.append((e, src, prev_end))
    return out


def estimate_p2p_ms(events: Iterable) -> float:
    """The typical time from a stage finishing an op to its neighbour starting the dependent one,
    counted only where the neighbour sat idle waiting (so the gap is transfer + hand-off overhead).
    The mean over such hand-offs (the replay should account for all of their time, not the typical
    one); 0 when there are none. Needs clocks comparable across stages, as on one host."""
    evs = stage_events(events)
    if not evs:
        return 0.0
    gaps = [max(e.start_ms - src.end_ms, 0.0) for e, src, prev_end in _handoffs(evs)
            if src is not None and (prev_end is None or prev_end <= src.end_ms)]
    return statistics.fmean(gaps) if gaps else 0.0


def estimate_overhead_ms(events: Iterable, p2p_ms: float | None = None) -> float:
    """The typical idle gap between two consecutive ops of a stage when the second one's input was
    already there (its neighbour's op had ended at least `p2p_ms` before the stage's previous op
    did; default `estimate_p2p_ms`): the per-op cost of issuing sends/receives and of the
    schedule's Python (and, for gloo on a busy CPU, transfers that complete late). The mean; 0 when
    there is no such pair."""
    evs = stage_events(events)
    if not evs:
        return 0.0
    p2p = estimate_p2p_ms(evs) if p2p_ms is None else p2p_ms
    gaps = [max(e.start_ms - prev_end, 0.0) for e, src, prev_end in _handoffs(evs)
            if prev_end is not None and (src is None or src.end_ms + p2p <= prev_end)]
    return statistics.fmean(gaps) if gaps else 0.0


def op_ms(events: Iterable, stages: int, micro_batches: int) -> tuple[list[list[float]], list[list[float]]]:
    """Per stage, per micro-batch, the measured forward and backward times (for `replay_schedule`)."""
    evs = stage_events(events)
    fwd = [[math.nan] * micro_batches for _ in range(stages)]
    bwd = [[math.nan] * micro_batches for _ in range(stages)]
    for e in evs:
        if 0 <= e.stage < stages and 0 <= e.micro_batch < micro_batches:
            (fwd if e.kind == FORWARD else bwd)[e.stage][e.micro_batch] = e.end_ms - e.start_ms
    for s in range(stages):
        if any(math.isnan(v) for v in fwd[s] + bwd[s]):
            raise ValueError(f"stage {s} lacks the forward or backward of some of the {micro_batches} micro-batches")
    return fwd, bwd
