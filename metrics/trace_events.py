"""The Trace Event Format's events (what Perfetto and chrome://tracing open) for a run's timeline:
pure functions of plain numbers, so the layout is tested without logs, torch or files.

Times in: seconds on the wall clock (the logs' `ts`) and milliseconds for durations; out: the
format's microseconds from `origin_s`. Tracks: one process per host (pid), one thread per rank and
lane (tid = rank * LANES + lane), so Perfetto groups a host's ranks and keeps each rank's steps,
communication, waits on it, pipeline micro-batches and profiler threads on tracks of their own,
where their spans nest (a thread's "X" events must not overlap partially)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from statistics import median
from typing import Any

LANES = 32
"""Tracks per rank: steps, four of communication, two of waits on it, pipeline, then profiler
threads (24 at most)."""
STEP_LANE, COMM_LANE, COMM_LANES, WAIT_LANE, WAIT_LANES, PIPELINE_LANE, PROFILER_LANE = 0, 1, 4, 5, 2, 7, 8
PHASES = ("data", "forward", "backward", "optimizer")
"""A step's timed phases, in the order they run."""


def tid_of(rank: int, lane: int) -> int:
    return rank * LANES + min(lane, LANES - 1)


def us(seconds: float, origin_s: float) -> float:
    """Microseconds from the origin, rounded to the nanosecond (the format's precision in practice)."""
    return round((seconds - origin_s) * 1e6, 3)


def complete(name: str, cat: str, ts_us: float, dur_us: float, pid: int, tid: int,
             args: dict[str, Any] | None = None) -> dict[str, Any]:
    """An "X" event; a negative duration (a clock step back) is clamped to 0, never written."""
    event = {"name": name, "cat": cat, "ph": "X", "ts": ts_us, "dur": round(max(dur_us, 0.0), 3), "pid": pid,
             "tid": tid}
    if args:
        event["args"] = args
    return event


def instant(name: str, cat: str, ts_us: float, pid: int, tid: int, args: dict[str, Any] | None = None,
            scope: str = "t") -> dict[str, Any]:
    event = {"name": name, "cat": cat, "ph": "i", "s": scope, "ts": ts_us, "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def metadata(kind: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    """An "M" event: process_name, thread_name (args.name) or a *_sort_index (args.sort_index)."""
    key = "name" if kind.endswith("_name") else "sort_index"
    event = {"name": kind, "ph": "M", "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def step_spans(end_us: float, step_ms: float, phases_ms: dict[str, float]) -> list[tuple[str, float, float]]:
    """(name, start_us, dur_us) of a step and its phases, in µs from the origin (absolute wall
    seconds would lose a quarter µs to float precision). The logs give a step's end (`ts`, when it
    was published: after its end by the publication's bookkeeping, well under a millisecond on an
    idle machine, up to ~10 ms seen on a loaded one) and durations only, so the step is laid back
    from its end, and the phases
    back-to-back in their order ending at the step's end: the untimed rest (the step clock's
    bookkeeping, control) shows as the gap at the step's start. Phases that sum to more than the
    step (rounding) are scaled down to fit, so they always nest."""
    step_us = step_ms * 1e3
    out = [("step", round(end_us - step_us, 3), round(step_us, 3))]
    timed = [(name, max(phases_ms.get(name, 0.0), 0.0) * 1e3) for name in PHASES]
    total_us = sum(d for _, d in timed)
    scale = step_us / total_us if total_us > step_us > 0 else 1.0
    at_us = end_us - total_us * scale
    for name, d in timed:
        if d > 0:
            out.append((name, round(at_us, 3), round(d * scale, 3)))
        at_us += d * scale
    return out


def host_offsets_s(step_ends: dict[str, dict[int, float]]) -> dict[str, float]:
    """Per host, the seconds to subtract from its wall clock so that its ranks' step ends meet
    the reference host's (the one with most steps). `step_ends`: host -> step -> the mean end of
    that step on the host's ranks. A synchronous step ends with a collective that all ranks leave
    together, so the median difference over the common steps is the hosts' clock offset, up to
    what runs after that collective (the optimizer, publishing): the limit of this alignment.
    A host sharing no step with the reference keeps its own clock (offset 0)."""
    if len(step_ends) < 2:
        return {host: 0.0 for host in step_ends}
    reference = max(sorted(step_ends), key=lambda h: len(step_ends[h]))
    ref = step_ends[reference]
    out = {}
    for host, ends in step_ends.items():
        common = [ends[s] - ref[s] for s in ends if s in ref]
        out[host] = median(common) if common and host != reference else 0.0
    return out


def profiler_shift_us(pairs: list[tuple[float, float, float, float]]) -> float:
    """The shift onto the run's clock of a profiler trace (its clock is the profiler's own).
    `pairs`: per profiled step, (the logged step's start, its end, the trace's `ProfilerStep#N`
    span's start, its end), µs. The span is the training step without its data loading, so it
    lies inside the logged step: of the shifts that put every span inside its step, the one that
    ends a span with its step (the latest); when jitter leaves none (a step's bookkeeping after
    the span varies), the one that spills least, the middle of the two bounds. 0 without any."""
    if not pairs:
        return 0.0
    lo = max(ss - ps for ss, _, ps, _ in pairs)
    hi = min(se - pe for _, se, _, pe in pairs)
    return hi if lo <= hi else (lo + hi) / 2


LANE_HORIZON_US = 1e6
"""A track forgets the spans that ended this long before the newest start it was given: a rank's
spans come in the order of its steps, so an older one can overlap nothing still to come, and
what a trace holds follows its ranks, not its length."""
LANE_PRUNE_AT = 64


class Lanes:
    """Places spans that may overlap (collectives in flight together) on the first of `count`
    tracks where they overlap nothing, so each track's spans nest; the last takes the rest."""

    def __init__(self, count: int):
        self._tracks: list[list[tuple[float, float]]] = [[] for _ in range(count)]
        self._newest_start = float("-inf")

    def place(self, start: float, end: float) -> int:
        self._newest_start = max(self._newest_start, start)
        for i, spans in enumerate(self._tracks):
            if len(spans) > LANE_PRUNE_AT:
                self._forget(spans)
            at = bisect_left(spans, (start, end))
            if (at == 0 or spans[at - 1][1] <= start) and (at == len(spans) or spans[at][0] >= end):
                spans.insert(at, (start, end))
                return i
        return len(self._tracks) - 1

    def held(self) -> int:
        return sum(len(spans) for spans in self._tracks)

    def _forget(self, spans: list[tuple[float, float]]) -> None:
        """Drop the spans (sorted by start) that ended before the horizon, oldest first."""
        before = self._newest_start - LANE_HORIZON_US
        keep = [span for span in spans if span[1] >= before]
        spans[:] = keep


class NestingLanes:
    """Places spans, given in (start, -duration) order, on the first track where they nest (inside
    the innermost open span, or after it ends): a profiler's thread whose spans overlap partly (an
    asynchronous op beside its caller) is split over tracks where each nests."""

    def __init__(self) -> None:
        self._open: list[list[float]] = []

    def place(self, start: float, end: float) -> int:
        for i, ends in enumerate(self._open):
            while ends and ends[-1] <= start:
                ends.pop()
            if not ends or end <= ends[-1]:
                ends.append(end)
                return i
        self._open.append([end])
        return len(self._open) - 1


class SeqRanges:
    """Which seqs of each (rank, group) are drawn already, as sorted, merged [first, last] ranges:
    as many as the gaps between them, not as the collectives (a long run's are one range)."""

    def __init__(self) -> None:
        self._ranges: dict[tuple[int, str], list[list[int]]] = {}

    def add(self, rank: int, group: str, seq: int) -> None:
        ranges = self._ranges.setdefault((rank, group), [])
        if ranges and ranges[-1][0] <= seq <= ranges[-1][1] + 1:  # the usual case: the next one
            ranges[-1][1] = max(ranges[-1][1], seq)
            return
        at = bisect_right(ranges, [seq, float("inf")])
        if at and ranges[at - 1][1] + 1 >= seq:
            ranges[at - 1][1] = max(ranges[at - 1][1], seq)
            at -= 1
        else:
            ranges.insert(at, [seq, seq])
        if at + 1 < len(ranges) and ranges[at + 1][0] <= ranges[at][1] + 1:
            ranges[at][1] = max(ranges[at][1], ranges.pop(at + 1)[1])

    def has(self, rank: int, group: str, seq: int) -> bool:
        ranges = self._ranges.get((rank, group))
        if not ranges:
            return False
        at = bisect_right(ranges, [seq, float("inf")])
        return at > 0 and ranges[at - 1][1] >= seq
