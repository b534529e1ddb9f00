"""The pipeline fold: stage timelines folded into complete steps, the bubble measured beside theory and
beside a replay of the schedule, and how the bubble moved as the micro-batch count changed.
Pure Python over protocol messages (no Textual, no Rich); the torch-free schedule arithmetic is
`ringtop.metrics.costs.pipeline_schedule`.

Each rank of a pipeline run sends its own stage's `Timeline` for a sample of the steps; a step is
drawn once the timelines of all its stages arrived. Span times are relative to each stage's own
step window; when every stage sent its window's start on the host clock (`window_start_ms`) and all
stages run on one host, the stages are lined up by it on one time axis (then the transfer time
between stages can be estimated), otherwise each stage is drawn from its own window start (every
stage enters its window at the same step boundary, so they are close).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ringtop.metrics.costs.pipeline_bubble import BubbleBreakdown, explain_bubble
from ringtop.metrics.costs.pipeline_schedule import (
    ScheduleReplay,
    check_schedule,
    op_ms,
    replay_schedule,
    stage_times,
    theoretical_bubble,
)
from ringtop.protocol import StageSpan, Timeline

MAX_PENDING_STEPS = 16
"""Steps whose timelines are still incomplete (some stage's not arrived yet) kept at once."""
MAX_HISTORY = 8
"""Segments of the bubble-vs-M history kept (one per run of steps with the same N, M, schedule)."""




@dataclass(frozen=True)
class StageLine:
    """One stage of one step, as measured."""

    stage: int
    rank: int
    window_ms: float
    spans: tuple[StageSpan, ...]
    """As sent: relative to this stage's window start."""
    busy_ms: float
    forward_ms: float
    backward_ms: float
    wait_recv_ms: float
    """Idle gaps right before an op that needed a neighbour's output (see pipeline_schedule.stage_times)."""
    bubble: float
    """1 - busy / window on this stage."""
    agent_bubble: float
    """The bubble the agent sent (Timeline.bubble); equals `bubble` up to its rounding."""
    offset_ms: float = 0.0
    """Where this stage's window starts on the step's common time axis (0 unless aligned)."""
    host: str = ""

    @property
    def idle_ms(self) -> float:
        return max(self.window_ms - self.busy_ms, 0.0)

    @property
    def ops(self) -> int:
        return len(self.spans)


class Analysis(NamedTuple):
    breakdown: BubbleBreakdown | None
    replay: ScheduleReplay | None
    error: str
    replay_offset_ms: float


@dataclass(frozen=True)
class PipelineStep:
    """The whole pipeline of one step: every stage's timeline, the measured bubble, the theory and
    the replayed prediction. The replay (a few replays of the schedule: milliseconds for big N x M)
    is computed when first asked for, so folding a long log in stays fast."""

    step: int
    schedule: str
    stages: int
    micro_batches: int
    lines: tuple[StageLine, ...]
    measured: float
    """Pipeline bubble: 1 - Σ busy / Σ window over the stages (= 1 - Σbusy / (N x window) for equal windows)."""
    theory: float
    """(N-1)/(N+M-1), nan when N or M is unusable."""
    aligned: bool = False
    """The stages are lined up by their window starts on one host's clock (else each from its own)."""
    events: tuple = ()
    """(stage, micro_batch, op, start_ms, end_ms) on the common axis, for the replay."""
    windows: tuple = ()
    """Per stage (start_ms, end_ms) on the common axis."""

    @functools.cached_property
    def _analysis(self) -> Analysis:
        n, m = self.stages, self.micro_batches
        try:
            key = check_schedule(self.schedule) if self.schedule else "gpipe"
            windows = dict(enumerate(self.windows))
            breakdown = explain_bubble(self.events, key, n, m, window_ms=windows)
            fwd_ms, bwd_ms = op_ms(self.events, n, m)
            replay = replay_schedule(key, n, m, fwd_ms, bwd_ms, breakdown.p2p_ms, breakdown.overhead_ms)
        except (ValueError, ZeroDivisionError, KeyError, IndexError) as exc:
            return Analysis(None, None, str(exc) or type(exc).__name__, 0.0)
        first_op = min((op.start_ms for ops in replay.timeline for op in ops), default=0.0)
        offset = min(e[3] for e in self.events) - first_op
        return Analysis(breakdown, replay, "", offset)

    @property
    def breakdown(self) -> BubbleBreakdown | None:
        """Theory -> replays -> measurement (pipeline_bubble.explain_bubble); None when no replay."""
        return self._analysis.breakdown

    @property
    def replay(self) -> ScheduleReplay | None:
        """The schedule replayed with each op's measured time, the estimated transfer time and per-op
        overhead: the full prediction, drawn under the measured rows."""
        return self._analysis.replay

    @property
    def replay_error(self) -> str:
        """Why there is no replay (unknown schedule, a stage's timeline lacks some micro-batch)."""
        return self._analysis.error

    @property
    def replay_offset_ms(self) -> float:
        """Where the replay's time 0 sits on the common axis (its first op where the measured first op is)."""
        return self._analysis.replay_offset_ms

    def replay_bubble(self, stage: int) -> float:
        """A stage's bubble in the replay (nan without one)."""
        r = self.replay
        return r.bubble[stage] if r is not None and 0 <= stage < len(r.bubble) else math.nan

    @property
    def worst(self) -> StageLine:
        return max(self.lines, key=lambda s: (s.bubble, -s.stage))

    @property
    def predicted(self) -> float:
        """The replayed pipeline bubble (nan without a replay)."""
        return self.breakdown.replay_overhead if self.breakdown is not None else math.nan

    @property
    def span_ms(self) -> float:
        """The time axis: to the latest window (or span) end of any stage, and the replay's end."""
        ends = [line.offset_ms + max(line.window_ms, max((s.end_ms for s in line.spans), default=0.0))
                for line in self.lines]
        if self.replay is not None:
            ends.append(self.replay_offset_ms + self.replay.makespan_ms)
        return max(ends, default=0.0)


REPLAYS_PER_SEGMENT = 4
"""The history's replayed bubble of a segment is the mean over its last few samples (each replay
costs milliseconds for large N x M; the measured mean covers every sample)."""


@dataclass
class BubbleSegment:
    """Consecutive sampled steps with the same schedule, N and M: the bubble-vs-M history."""

    schedule: str
    stages: int
    micro_batches: int
    first_step: int
    last_step: int
    theory: float
    samples: int = 0
    measured_sum: float = 0.0
    last_measured: float = math.nan
    recent: deque = field(default_factory=lambda: deque(maxlen=REPLAYS_PER_SEGMENT))
    """The last few PipelineSteps, for the replayed bubble."""

    @property
    def measured(self) -> float:
        return self.measured_sum / self.samples if self.samples else math.nan

    @property
    def predicted(self) -> float:
        vals = [p.predicted for p in self.recent if math.isfinite(p.predicted)]
        return sum(vals) / len(vals) if vals else math.nan

    def add(self, p: PipelineStep) -> None:
        self.last_step = max(self.last_step, p.step)
        if math.isfinite(p.measured):
            self.samples += 1
            self.measured_sum += p.measured
        self.last_measured = p.measured
        self.recent.append(p)


class PipelineState:
    """Folds `Timeline` messages into complete pipeline steps and the bubble-vs-M history."""

    def __init__(self) -> None:
        self._pending: dict[int, dict[int, Timeline]] = {}
        self.latest: PipelineStep | None = None
        self.history: deque[BubbleSegment] = deque(maxlen=MAX_HISTORY)
        self.timelines_total = 0
        self.steps_total = 0
        self.version = 0
        """Bumped whenever `latest` or `history` changes (the tab repaints only then)."""
        self.last_stages = 0
        self.last_micro_batches = 0
        self.last_schedule = ""

    @property
    def seen(self) -> bool:
        """Whether any timeline arrived: the run is a pipeline."""
        return self.timelines_total > 0

    def add(self, msg: Timeline, host: str = "") -> PipelineStep | None:
        """Fold one timeline in (`host`: the sending rank's host, to know whether window starts are
        comparable); returns the pipeline step it completed, if any."""
        self.timelines_total += 1
        if msg.stages < 1 or not 0 <= msg.stage < msg.stages or msg.micro_batches < 1:
            return None
        self.last_stages, self.last_micro_batches = msg.stages, msg.micro_batches
        self.last_schedule = msg.schedule or self.last_schedule
        if self.latest is not None and msg.step <= self.latest.step:
            return None  # a replica's copy, or late: the newer step is already shown
        got = self._pending.setdefault(msg.step, {})
        have = got.get(msg.stage)
        if have is None or msg.rank < have[0].rank:  # data-parallel replicas: the lowest rank's stage
            got[msg.stage] = (msg, host)
        while len(self._pending) > MAX_PENDING_STEPS:
            del self._pending[min(self._pending)]
        shape = {(t.stages, t.micro_batches) for t, _ in got.values()}
        if len(shape) != 1 or len(got) < msg.stages or set(got) != set(range(msg.stages)):
            return None
        for s in [s for s in self._pending if s <= msg.step]:
            del self._pending[s]
        p = build_step(msg.step, [got[s][0] for s in range(msg.stages)], [got[s][1] for s in range(msg.stages)])
        self.latest = p
        self.steps_total += 1
        seg = self.history[-1] if self.history else None
        if seg is None or (seg.schedule, seg.stages, seg.micro_batches) != (p.schedule, p.stages, p.micro_batches):
            seg = BubbleSegment(p.schedule, p.stages, p.micro_batches, p.step, p.step, p.theory)
            self.history.append(seg)
        seg.add(p)
        self.version += 1
        return p


def _theory(schedule: str, stages: int, micro_batches: int, sent: float) -> float:
    try:
        return theoretical_bubble(schedule or "gpipe", stages, micro_batches)
    except ValueError:
        return sent if sent > 0 else math.nan


def stage_offsets(timelines: list[Timeline], hosts: list[str]) -> list[float] | None:
    """Each stage's window start on a common axis, from `window_start_ms`, when they are comparable:
    every stage sent one, all on one host, and they lie within one window of each other."""
    starts = [t.window_start_ms for t in timelines]
    if not starts or any(not (math.isfinite(x) and x > 0) for x in starts) or len(set(hosts)) > 1:
        return None
    base = min(starts)
    offsets = [x - base for x in starts]
    longest = max((t.window_ms for t in timelines), default=0.0)
    if max(offsets) > max(longest, 1.0):
        return None  # not the same step boundary (or not the same clock): do not pretend
    return offsets


def build_step(step: int, timelines: list[Timeline], hosts: list[str] | None = None) -> PipelineStep:
    """One complete step from the timelines of stages 0..N-1 (in stage order)."""
    first = timelines[0]
    n, m = first.stages, first.micro_batches
    hosts = list(hosts) if hosts is not None else [""] * len(timelines)
    schedule = next((t.schedule for t in timelines if t.schedule), "")
    offsets = stage_offsets(timelines, hosts)
    aligned = offsets is not None
    offsets = offsets or [0.0] * len(timelines)
    events = [(t.stage, sp.micro_batch, sp.op, o + sp.start_ms, o + sp.end_ms)
              for t, o in zip(timelines, offsets) for sp in t.spans]
    windows = {}
    for t, o in zip(timelines, offsets):
        end = max((sp.end_ms for sp in t.spans), default=0.0)
        windows[t.stage] = (o, o + (t.window_ms if t.window_ms > 0 else end))
    times = stage_times(events, windows, n) if events else {}
    lines = []
    for t, o, host in zip(timelines, offsets, hosts):
        st = times.get(t.stage)
        window = windows[t.stage][1] - o
        if st is not None:
            busy, fwd, bwd, wait, bubble = st.busy_ms, st.forward_ms, st.backward_ms, st.wait_recv_ms, st.bubble
        else:  # no spans: the agent's own figure
            busy, fwd, bwd, wait, bubble = (1.0 - t.bubble) * window, 0.0, 0.0, 0.0, t.bubble
        lines.append(StageLine(stage=t.stage, rank=t.rank, window_ms=window, spans=tuple(t.spans), busy_ms=busy,
                               forward_ms=fwd, backward_ms=bwd, wait_recv_ms=wait, bubble=bubble,
                               agent_bubble=t.bubble, offset_ms=o, host=host))
    total_window = sum(line.window_ms for line in lines)
    measured = 1.0 - sum(line.busy_ms for line in lines) / total_window if total_window > 0 else math.nan
    theory = _theory(schedule, n, m, first.bubble_theory)
    return PipelineStep(step=step, schedule=schedule, stages=n, micro_batches=m, lines=tuple(lines),
                        measured=measured, theory=theory, aligned=aligned, events=tuple(events),
                        windows=tuple(windows[s] for s in range(n)))
