"""Collects the collectives a strategy issues: kind, bytes, group size, issue and completion time.

`begin` runs on the training thread (inside a comm hook), `end` on the backend's completion thread.
Both only append to lists; `drain` at the step boundary turns them into per-kind totals.

Two clocks. Host records (`end`, `blocked`, `blocked_p2p`) carry `perf_counter_ns` times: that is
the CPU / gloo path, where a work's future completes when the collective has finished. Device
records (`end_device`, `blocked_device`) carry two CUDA events each (see `strategies/collective_hooks`
for where they are recorded): on NCCL the future completes when the work is *enqueued*, so only
the device knows when it ran. `drain` never synchronises: it polls each pending device record's
events with `query()`, turns the completed ones into intervals, and carries the rest to the next
drain. On GPU a step's totals are therefore those of the collectives that had finished on the
device by the step's end, usually the previous step's (the host runs ahead of the device).

How the device intervals become the summary (all in device time, on one timeline per drain:
`anchor.elapsed_time(event)` from the first completed record's start event):

- A collective's interval runs from its start event (recorded on the issuing stream just before
  the issue: the point from which NCCL's stream may start it) to its end event (recorded on a
  stream made to wait for the work). Collectives of one process group run in issue order on that
  group's NCCL stream, so a collective's start is moved up to the previous one's end in the same
  `lane`: queueing behind an earlier collective is not counted as this one's time.
  `CommStat.busy_ms` sums these intervals per kind; `CommSummary.busy_ms` is their union.
- Exposed time is what the training (compute) stream spent stalled on communication: between an
  event recorded on it just before a `Work.wait()` (or a blocking collective issued on it) and one
  just after. When a step has no such stall (DDP's reducer and FSDP2 make the compute stream wait
  in C++ or through stream events, which ringtop does not see), the tail from the last collective
  becoming ready to the last completion stands in, as it does on the host.
- Point-to-point stalls (a pipeline waiting for the other stage) are `p2p_wait_ms`, not exposed
  collective communication.

Each collective of a step is also kept on its own (`CommSummary.calls`, the first
MAX_CALLS_PER_STEP): a wait reported with the collective's handle is its wait. `call_records`
turns them into the log's `calls` message when the step is reported: host times as they are,
device times by `query()` and `elapsed_time` on completed events only, as above.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ringtop.protocol import CollectiveCall, CommStat, GroupCursor, InFlight
from ringtop.protocol.messages import MAX_CALLS_PER_STEP, MAX_GROUP_CHARS, MAX_KIND_CHARS

MAX_PENDING_DEVICE = 4096
"""Device records whose events have not completed are kept at most this many (oldest dropped)."""
LEDGER_CAPACITY = 4096
"""The ledger keeps this many of the latest collectives (a ring, like PyTorch's Flight Recorder)."""


class LedgerEntry:
    """One collective: what, on which group, its place there, when issued and completed (perf ns,
    0 until completed). Written by `begin` and `end`, read by the stall watch and `ctl dump`."""

    __slots__ = ("group", "seq", "kind", "nbytes", "shapes", "group_size", "issued_ns", "done_ns", "dim")

    def __init__(self, group: str, seq: int, kind: str, nbytes: int, shapes: str, group_size: int,
                 issued_ns: int, dim: str = "") -> None:
        self.group, self.seq, self.kind, self.nbytes, self.shapes = group, seq, kind, nbytes, shapes
        self.group_size, self.issued_ns, self.done_ns, self.dim = group_size, issued_ns, 0, dim

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class StepCall:
    """One collective of the current step, kept for its record in the step's report: its ledger
    entry, and the wait on it (host ns, or two CUDA events) and its device interval where known."""

    __slots__ = ("entry", "wait_start_ns", "wait_end_ns", "device", "device_wait")

    def __init__(self, entry: LedgerEntry) -> None:
        self.entry = entry
        self.wait_start_ns = self.wait_end_ns = 0
        self.device: tuple[Any, Any] | None = None
        self.device_wait: tuple[Any, Any] | None = None


@dataclass(frozen=True)
class CommSummary:
    kinds: list[CommStat]
    """Per kind and mesh dimension, the totals the Step message carries as they are."""
    exposed_comm_ms: float
    """Exposed communication: the training thread's measured waits when the strategy reports them;
    for DDP (whose reducer waits in C++) the time from the last bucket's issue to the last
    completion, since after the last bucket is issued backward has no compute left to hide behind.
    On GPU, the compute stream's measured stalls (see the module docstring). Point-to-point waits
    are not in it."""
    busy_ms: float
    """Union of the collectives' in-flight intervals."""
    p2p_wait_ms: float = 0.0
    """Time the training thread (or, on GPU, the compute stream) waited on point-to-point
    transfers: on a pipeline mostly the other stage's compute, i.e. bubble."""
    pending: int = 0
    """Device records carried to the next drain because their events had not completed."""
    collectives: list[GroupCursor] = field(default_factory=list)
    """Per process group used since the previous drain: progress and the digest of its calls."""
    calls: list[StepCall] = field(default_factory=list)
    """Each collective issued since the previous drain, the first MAX_CALLS_PER_STEP."""
    calls_dropped: int = 0
    """Those issued past them."""


@dataclass
class _DeviceRecord:
    handle: int
    kind: str
    nbytes: int
    group_size: int
    start: Any
    end: Any
    lane: Any
    dim: str = ""


def _no_dimension(group: str) -> str:
    return ""


class CommTracer:
    def __init__(self, ledger_capacity: int = LEDGER_CAPACITY,
                 dimension_of: Callable[[str], str] = _no_dimension) -> None:
        self._dimension_of = dimension_of
        """A group's name -> the mesh dimension it is on ("" if none): CommStat.group."""
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._open: dict[int, LedgerEntry] = {}
        self._done: list[tuple[str, int, int, int, int]] = []
        self.ledger: collections.deque[LedgerEntry] = collections.deque(maxlen=ledger_capacity)
        self._issued: dict[str, int] = {}
        """Per group, the seq of the last collective issued (they count from 1)."""
        self._completed: dict[str, int] = {}
        self._step_calls: dict[str, tuple[int, int]] = {}
        """Per group, since the last drain: (count, running digest)."""
        self._blocked: list[tuple[int, int]] = []
        self._p2p_blocked: list[tuple[int, int]] = []
        self._device: list[_DeviceRecord] = []
        self._stalls: list[tuple[Any, Any, bool]] = []
        self.device_dropped = 0
        self.max_calls = MAX_CALLS_PER_STEP
        self._calls: list[StepCall] = []
        self._calls_dropped = 0
        self._call_of: dict[int, StepCall] = {}
        """Handle -> this step's record of the collective, for the waits reported with a handle."""

    @property
    def in_flight(self) -> int:
        """Collectives begun whose end has not been recorded (gloo records it on its own thread)."""
        with self._lock:
            return len(self._open)

    def begin(self, kind: str, nbytes: int, group_size: int, group: str = "world", shapes: str = "") -> int:
        handle = next(self._ids)
        dim = self._dimension_of(group) or ""
        now = time.perf_counter_ns()
        with self._lock:
            seq = self._issued[group] = self._issued.get(group, 0) + 1
            entry = LedgerEntry(group, seq, kind, nbytes, shapes, group_size, now, dim)
            self._open[handle] = entry
            self.ledger.append(entry)
            count, digest = self._step_calls.get(group, (0, 0))
            self._step_calls[group] = (count + 1, zlib.crc32(f"{kind}:{nbytes}:{shapes}".encode(), digest))
            if len(self._calls) < self.max_calls:
                call = self._call_of[handle] = StepCall(entry)
                self._calls.append(call)
            else:
                self._calls_dropped += 1
        return handle

    def end(self, handle: int) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            entry = self._open.pop(handle, None)
            if entry is not None:
                self._close(entry, now)
                self._done.append((entry.kind, entry.nbytes, entry.group_size, entry.issued_ns, now, entry.dim))

    def _close(self, entry: LedgerEntry, now_ns: int) -> None:
        entry.done_ns = now_ns
        if entry.seq > self._completed.get(entry.group, 0):
            self._completed[entry.group] = entry.seq

    def in_flight_ops(self, now_ns: int | None = None, limit: int = 64) -> list[InFlight]:
        """The collectives issued and not seen complete, oldest first (for the stall watch: any thread)."""
        now_ns = time.perf_counter_ns() if now_ns is None else now_ns
        with self._lock:
            entries = sorted(self._open.values(), key=lambda e: e.issued_ns)[:limit]
        return [InFlight(group=e.group, seq=e.seq, kind=e.kind, bytes=e.nbytes, shapes=e.shapes,
                         age_s=max(0.0, (now_ns - e.issued_ns) / 1e9)) for e in entries]

    def cursors(self) -> list[GroupCursor]:
        with self._lock:
            return [GroupCursor(group=g, issued=n, completed=self._completed.get(g, 0))
                    for g, n in sorted(self._issued.items())]

    def ledger_entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e.as_dict() for e in self.ledger]

    def blocked(self, start_ns: int, end_ns: int, handle: int | None = None) -> None:
        """The training thread waited on communication (host clock); `handle`: on that collective."""
        with self._lock:
            self._blocked.append((start_ns, end_ns))
            self._waited(handle, start_ns, end_ns)

    def blocked_p2p(self, start_ns: int, end_ns: int, handle: int | None = None) -> None:
        """The training thread waited on a point-to-point transfer (host clock)."""
        with self._lock:
            self._p2p_blocked.append((start_ns, end_ns))
            self._waited(handle, start_ns, end_ns)

    def _waited(self, handle: int | None, start_ns: int, end_ns: int) -> None:
        """A collective's first wait, in its record of this step (under the lock)."""
        call = self._call_of.get(handle) if handle is not None else None
        if call is not None and not call.wait_end_ns:
            call.wait_start_ns, call.wait_end_ns = start_ns, end_ns

    def end_device(self, handle: int, start_event: Any, end_event: Any, lane: Any = None) -> None:
        """The collective `handle` runs on the device between two CUDA events (timing enabled);
        `lane`: what it queues behind in issue order (its process group's stream), or None."""
        with self._lock:
            entry = self._open.pop(handle, None)
            if entry is not None:
                self._close(entry, time.perf_counter_ns())  # enqueued: the device's own end is in the events
                self._device.append(_DeviceRecord(handle, entry.kind, entry.nbytes, entry.group_size, start_event,
                                                  end_event, lane, entry.dim))
                self._trim()
                if (call := self._call_of.get(handle)) is not None:
                    call.device = (start_event, end_event)

    def blocked_device(self, start_event: Any, end_event: Any, p2p: bool = False, handle: int | None = None) -> None:
        """The compute stream stalled on communication between two CUDA events; `handle`: on that collective."""
        with self._lock:
            self._stalls.append((start_event, end_event, p2p))
            self._trim()
            call = self._call_of.get(handle) if handle is not None else None
            if call is not None and call.device_wait is None:
                call.device_wait = (start_event, end_event)

    def _trim(self) -> None:
        for pending in (self._device, self._stalls):
            if len(pending) > MAX_PENDING_DEVICE:
                extra = len(pending) - MAX_PENDING_DEVICE
                del pending[:extra]
                self.device_dropped += extra

    def drain(self) -> CommSummary:
        with self._lock:
            done, self._done = self._done, []
            blocked, self._blocked = self._blocked, []
            p2p_blocked, self._p2p_blocked = self._p2p_blocked, []
            device, self._device = self._device, []
            stalls, self._stalls = self._stalls, []
            step_calls, self._step_calls = self._step_calls, {}
            calls, self._calls, dropped, self._calls_dropped = self._calls, [], self._calls_dropped, 0
            self._call_of = {}
            collectives = [GroupCursor(group=g, issued=self._issued[g], completed=self._completed.get(g, 0),
                                       count=n, digest=f"{digest:08x}")
                           for g, (n, digest) in sorted(step_calls.items())]
        totals: dict[tuple[str, str], CommStat] = {}
        for kind, nbytes, group_size, t0, t1, dim in done:
            _add(totals, kind, dim, nbytes, group_size, (t1 - t0) / 1e6)
        busy_ns = union_ns([(d[3], d[4]) for d in done])
        collective = [(d[3], d[4]) for d in done if d[0] != "p2p"]
        exposed_comm_ms = exposed_ns(blocked, collective, busy_ns if done else None) / 1e6
        busy_ms = busy_ns / 1e6
        p2p_wait_ms = union_ns(p2p_blocked) / 1e6
        pending = 0
        if device or stalls:
            d_busy, d_blocked, d_p2p, pending = self._resolve_device(device, stalls, totals)
            busy_ms += d_busy
            exposed_comm_ms += d_blocked
            p2p_wait_ms += d_p2p
        return CommSummary(kinds=list(totals.values()), exposed_comm_ms=exposed_comm_ms, busy_ms=busy_ms,
                           p2p_wait_ms=p2p_wait_ms, pending=pending, collectives=collectives, calls=calls,
                           calls_dropped=dropped)

    def _resolve_device(self, device: list[_DeviceRecord], stalls: list[tuple[Any, Any, bool]],
                        totals: dict[tuple[str, str], CommStat]) -> tuple[float, float, float, int]:
        """(busy, exposed, p2p wait) ms of the device records whose events have completed; the
        others go back to the pending lists. Only `Event.query()` and `elapsed_time` on completed
        events: nothing here waits for the device."""
        ready, carry = _split(device, lambda r: r.end.query() and r.start.query())
        ready_stalls, carry_stalls = _split(stalls, lambda s: s[1].query() and s[0].query())
        with self._lock:
            self._device[:0] = carry
            self._stalls[:0] = carry_stalls
            self._trim()
            pending = len(self._device)
        if not ready and not ready_stalls:
            return 0.0, 0.0, 0.0, pending
        ready.sort(key=lambda r: r.handle)
        anchor = ready[0].start if ready else ready_stalls[0][0]

        def at(event: Any) -> float:  # ns on this drain's device timeline
            return anchor.elapsed_time(event) * 1e6

        def span(start: Any, end: Any) -> tuple[float, float] | None:
            try:
                return at(start), at(end)
            except RuntimeError:  # an event CUDA cannot time (another device?): drop, never stop training
                self.device_dropped += 1
                return None

        collective: list[tuple[float, float]] = []
        intervals: list[tuple[float, float]] = []
        lane_end: dict[Any, float] = {}
        for r in ready:
            if (iv := span(r.start, r.end)) is None:
                continue
            s, e = iv
            if r.lane is not None:
                prev = lane_end.get(r.lane)
                if prev is not None:
                    s = min(max(s, prev), e)
                lane_end[r.lane] = e if prev is None else max(prev, e)
            intervals.append((s, e))
            if r.kind != "p2p":
                collective.append((s, e))
            _add(totals, r.kind, r.dim, r.nbytes, r.group_size, (e - s) / 1e6)
        busy_ns = union_ns(intervals)
        stall_iv, p2p_iv = [], []
        for a, b, p2p in ready_stalls:
            if (iv := span(a, b)) is not None:
                (p2p_iv if p2p else stall_iv).append(iv)
        exposed_comm_ms = exposed_ns(stall_iv, collective, busy_ns if intervals else None) / 1e6
        return busy_ns / 1e6, exposed_comm_ms, union_ns(p2p_iv) / 1e6, pending


def call_records(calls: list[StepCall], step_start_ns: int, device_begin: Any = None) -> list[CollectiveCall]:
    """A step's collectives as its `calls` message lists them, in ms from the step's start: host
    times from the step clock's begin (`step_start_ns`, perf_counter); a device interval or wait
    from `device_begin`, the step's first CUDA event, once both its events have completed (never
    waited for: otherwise None). The events are let go here."""
    out = []
    for call in calls:
        e = call.entry
        rec = CollectiveCall(kind=e.kind[:MAX_KIND_CHARS], group=_clipped(e.group), seq=e.seq, bytes=e.nbytes,
                             issued_ms=(e.issued_ns - step_start_ns) / 1e6)
        if call.device is not None or call.device_wait is not None:
            rec.device = True
            rec.done_ms = _device_ms(device_begin, call.device[1]) if call.device is not None else None
            if call.device_wait is not None:
                rec.wait_start_ms, rec.wait_end_ms = (_device_ms(device_begin, ev) for ev in call.device_wait)
                if rec.wait_start_ms is None or rec.wait_end_ms is None:
                    rec.wait_start_ms = rec.wait_end_ms = None
            call.device = call.device_wait = None
        else:
            rec.done_ms = (e.done_ns - step_start_ns) / 1e6 if e.done_ns else None
            if call.wait_end_ns:
                rec.wait_start_ms = (call.wait_start_ns - step_start_ns) / 1e6
                rec.wait_end_ms = (call.wait_end_ns - step_start_ns) / 1e6
        out.append(rec)
    return out


def _device_ms(begin: Any, event: Any) -> float | None:
    if begin is None or event is None:
        return None
    try:
        if not (begin.query() and event.query()):
            return None
        return float(begin.elapsed_time(event))
    except RuntimeError:  # not timed, or on another device: not known, never a stop
        return None


def _clipped(group: str) -> str:
    return group if len(group) <= MAX_GROUP_CHARS else group[:MAX_GROUP_CHARS - 1] + "…"


def _split(items: list, complete: Any) -> tuple[list, list]:
    done, waiting = [], []
    for item in items:
        (done if complete(item) else waiting).append(item)
    return done, waiting


def _add(totals: dict[tuple[str, str], CommStat], kind: str, dim: str, nbytes: int, group_size: int,
         ms: float) -> None:
    """One call into its (kind, mesh dimension)'s totals, which keep the group size of their first call."""
    agg = totals.get((kind, dim))
    if agg is None:
        agg = totals[(kind, dim)] = CommStat(kind=kind, group_size=group_size, group=dim)
    agg.count += 1
    agg.bytes += nbytes
    agg.busy_ms += ms


def exposed_ns(stalls: list[tuple[float, float]], collectives: list[tuple[float, float]],
               busy_ns: float | None) -> float:
    """The exposed-communication rule, one clock at a time (host ns or device ns): the measured
    stalls on communication when there are any; else the tail from the last collective's start to
    the last completion (after the last one is issued nothing is left to hide it behind); never
    more than the time anything was in flight (`busy_ns`; None: nothing was, no cap). `collectives`:
    (start, end) of the collectives, point-to-point transfers left out."""
    if stalls:
        exposed = union_ns(stalls)
    elif collectives:
        exposed = max(0.0, max(e for _, e in collectives) - max(s for s, _ in collectives))
    else:
        exposed = 0.0
    return exposed if busy_ns is None else min(exposed, busy_ns)


def union_ns(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
