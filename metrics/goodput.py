"""Goodput: the share of a run's wall time spent in productive steps. The one owner of the number
(the UI's header, `ringtop summary` and the Prometheus exporter all fold messages through it).

The wall runs from the run's first Hello (its process's start, when the Hello carries it) to its
latest message. Every second of it is put down to
one thing, so that the lost seconds by cause and the productive seconds add up to the wall:

- `stall`: some rank was reported stalled (`Stall` messages: `stalled`, repeated while it lasts,
  then `recovered`), from the start of its stalled phase (the first report's ts − `running_s`) to
  its recovery, or to the latest message while it lasts. Stalled time is never productive, also
  inside a step that eventually ended, and is counted once however many ranks stall together (in
  a synchronous run the others wait for it at the next collective).
- productive: rank 0's steps (each `[ts − step_ms, ts]`, clipped so that steps never overlap),
  less stalled time in them.
- `skipped`: steps whose `skipped` field is true (a non-finite step that changed nothing).
- `checkpoint`, `switch`: the `seconds` of rank 0's `checkpoint` and `switch` events, the interval
  `[ts − seconds, ts]`, less the steps and stalls inside it: a background save overlaps training,
  and only what it did not overlap was lost.
- `startup`: from the first Hello — or, when it says so, the start of its rank's process — to the
  start of the first step (the whole wall before it).
- `restart`: the launcher started the run again after a failure (torchrun --max-restarts: every
  attempt keeps the run id, and its Hellos carry `restart_count`, 0 the first attempt; one
  without it counts as 0). A Hello of any rank whose `restart_count` is higher than any seen yet
  begins a restart, once per attempt. It loses the time from the end of rank 0's last step before
  it to the start of rank 0's first step after it (counted while it lasts), less the stalls the
  new attempt's ranks report meanwhile; then rank 0's steps that redo work: those numbered no
  higher than the highest step it reached before the restart (the run resumed from an older
  checkpoint, or from scratch), their time less the stalls in them. A restart before the run's
  first step loses nothing of its own: start-up covers it. A stall in progress when a restart
  begins ends at the end of rank 0's last step, and never later than the restart's Hello (one of
  an attempt that made no step ends at the next attempt's Hello): what follows is the restart's.
- `other`: the rest (step boundaries, commands, the diagnosis, the end of the run).

How ranks are combined: rank 0's view. Steps, checkpoints and switches are rank 0's (every rank
steps in lockstep; switch events are repeated by every rank); the wall spans every rank's
messages; stalls of any rank count, and so does a Hello that begins a restart.

A UI that attaches mid-run has missed the run's earlier steps; the wall its replayed Hello gives it
reaches back to the start all the same. Rank 0's relay therefore folds every message it forwards
into a Goodput of its own and sends its `state()` (a `goodput` message) to each new subscriber
right after the replayed Hellos; `add` takes such a message as the whole count up to its `ts`
(where it adds up: metrics/goodput_state.py), and the messages that follow it go on from there.
The state carries rank 0's latest 256 steps and 64 ended stalls, for what a later checkpoint or
long step overlapped; a checkpoint reported after the hand-over that reaches back past them is
clipped at the earliest step carried. It carries the restarts too: their seconds so far, their
number, the start of one in progress, and the step numbers a resumed run redoes.

Stdlib only, like the rest of `ringtop.metrics`: messages are recognised by their protocol type
tag (`hello`, `step`, ...), duck-typed, so this module imports neither msgspec nor the protocol.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from ringtop.metrics.goodput_state import (
    HANDED_STALLS,
    HANDED_STEPS,
    MAX_OPEN_STALLS,
    MAX_STARTUP_S,
    GoodputState,
    checked_state,
)
from ringtop.metrics.goodput_state import count as _count
from ringtop.metrics.goodput_state import real as _real

CAUSES = ("startup", "restart", "checkpoint", "switch", "stall", "skipped", "other")
"""Lost time's causes, in the order they are shown."""
STEP_HISTORY = 4096
"""Rank 0's recent steps kept to tell how much of a checkpoint overlapped training."""
STALL_HISTORY = 256
"""Finished stalls kept apart (older ones are folded into a total, as no later step reaches back
to them)."""


@dataclass(frozen=True)
class GoodputResult:
    productive_s: float = 0.0
    wall_s: float = 0.0
    lost_s: dict[str, float] = field(default_factory=dict)
    """Seconds lost by cause (CAUSES); with productive_s they add up to wall_s."""
    steps: int = 0
    """Rank 0's steps counted (productive, skipped or redone)."""
    restarts: int = 0
    """How many times the launcher restarted the run (the highest `restart_count` seen)."""

    @property
    def goodput(self) -> float:
        """productive / wall, 0..1; NaN before there is a wall."""
        if self.wall_s <= 0:
            return math.nan
        return min(1.0, max(0.0, self.productive_s / self.wall_s))

    @property
    def known(self) -> bool:
        """A step has been seen: before it, goodput is 0 by definition and says nothing."""
        return self.steps > 0 and self.wall_s > 0


_TAGS: dict[type, str] = {}
"""Protocol tag per message type, as `_tag` found it."""


def _tag(msg: Any) -> str:
    config = getattr(type(msg), "__struct_config__", None)
    return getattr(config, "tag", "") or ""


def _covered(a: float, b: float, pieces: Iterable[tuple[float, float]]) -> float:
    """Seconds of [a, b] inside the union of `pieces`."""
    clipped = sorted((max(a, s), min(b, e)) for s, e in pieces if e > a and s < b)
    total, reach = 0.0, a
    for s, e in clipped:
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


class Goodput:
    """Fed message by message (`add`): Hello, Step, Event, Stall, Bye; any other message only
    moves the wall's end. `result()` at any time. O(1) per message but for the rare checkpoint."""

    def __init__(self) -> None:
        self._reset("")

    def _reset(self, run_id: str) -> None:
        self.run_id = run_id
        self.world_size = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.first_step_start: float | None = None
        self._step_end: float | None = None
        self._steps: deque[tuple[float, float]] = deque(maxlen=STEP_HISTORY)
        self._step_count = 0
        self.productive_s = 0.0
        self._lost = dict.fromkeys(CAUSES, 0.0)
        self._open: dict[int, float] = {}
        """rank -> start of its stall in progress."""
        self._stalls: list[tuple[float, float]] = []
        """Finished stalls, merged where they overlap, in time order."""
        self._folded_stall_s = 0.0
        self._handed_over_ts: float | None = None
        """Where a restored state ends: an event's interval is clipped there."""
        self._startup_s: float | None = None
        """Start-up's seconds as a restored state counted them."""
        self._restored_stall_s = 0.0
        """A restored state's ended stalls, all before the first step when it had none."""
        self._startup_stalled_s = 0.0
        """Of the handed-over startup window, what the handed-over stalls covered (already taken
        out of `_startup_s`): a stall reported later takes out only what it adds."""
        self._restarts = 0
        self._restart_from: float | None = None
        """Start of the restart in progress: the end of rank 0's last step before it."""
        self._redo_through: int | None = None
        """After a restart, rank 0's steps numbered up to this redo work."""
        self._top_step: int | None = None
        """The highest step number rank 0 reached."""

    # ------------------------------------------------------------------ input

    def add(self, msg: Any) -> None:
        cls = type(msg)
        tag = _TAGS.get(cls)
        if tag is None:
            tag = _TAGS[cls] = _tag(msg)
        rank = getattr(msg, "rank", -1)
        ts = getattr(msg, "ts", None)
        if tag == "step" and rank != 0 and type(ts) is float and type(rank) is int:
            # most messages of a large run: a Step of another rank only moves the wall's end
            if self.first_ts is None or rank < 0 or not ts - ts == 0.0 or (self.world_size and rank >= self.world_size):
                return
            if ts > self.last_ts:
                self.last_ts = ts
            return
        ts = _real(ts)
        if tag == "hello":
            self._hello(msg, ts)
            return
        if tag == "goodput":
            self._restore(msg)
            return
        if self.first_ts is None or ts is None or not isinstance(rank, int) or rank < 0:
            return  # before the run's first Hello, or the UI's own
        if self.world_size and rank >= self.world_size:
            return
        if ts > self.last_ts:
            self.last_ts = ts
        if tag == "step" and rank == 0:
            self._step(_real(getattr(msg, "step_ms", None)), getattr(msg, "skipped", False) is True, ts,
                       _count(getattr(msg, "step", None)))
        elif tag == "event" and rank == 0:
            self._event(msg, ts)
        elif tag == "stall":
            self._stall(msg, rank, ts)
        elif tag == "bye":
            self._end_stall(rank, ts)

    def _hello(self, msg: Any, ts: float | None) -> None:
        rank, world = getattr(msg, "rank", -1), getattr(msg, "world_size", 0)
        if not isinstance(rank, int) or not isinstance(world, int) or not 0 <= rank < world:
            return  # the UI's own, or a rank outside its world
        run_id = getattr(msg, "run_id", "")
        if run_id != self.run_id:
            if self.first_ts is not None and self.run_id and run_id:
                self._reset(run_id)  # a new run: its own goodput
            self.run_id = self.run_id or run_id
        if rank == 0:
            self.world_size = world
        if ts is None:
            return
        attempt = _count(getattr(msg, "restart_count", 0))
        if attempt is not None and attempt > self._restarts:
            self._restart(attempt, ts)
        started = _real(getattr(msg, "process_started_ts", None))
        if started is not None and 0 < started < ts and ts - started < MAX_STARTUP_S:
            ts = started  # the wall begins when the rank's process did, not at its Hello
        if self.first_ts is None or ts < self.first_ts:
            self.first_ts = ts  # the earliest Hello (a late, cached copy is older than nothing)
        if self.last_ts is None or ts > self.last_ts:
            self.last_ts = ts

    def _restart(self, attempt: int, ts: float) -> None:
        """The first Hello of a new attempt of the run."""
        self._restarts = attempt
        gap = self._restart_from is not None  # the last attempt made no step
        end = ts if self._step_end is None or gap else min(ts, self._step_end)
        for rank in list(self._open):
            self._end_stall(rank, end)
        if self._step_end is not None and not gap:
            self._restart_from = self._step_end
        self._redo_through = self._top_step

    def add_step(self, rank: int, ts: float, step_ms: float, skipped: bool, step: int) -> None:
        """A step known by its numbers only (a digest's brief of it): as `add` of its Step."""
        ts_real = _real(ts)
        if self.first_ts is None or ts_real is None or type(rank) is not int or rank < 0:
            return
        if self.world_size and rank >= self.world_size:
            return
        if ts_real > self.last_ts:
            self.last_ts = ts_real
        if rank == 0:
            self._step(_real(step_ms), skipped is True, ts_real, _count(step))

    def _step(self, step_ms: float | None, skipped: bool, ts: float, n: int | None) -> None:
        if step_ms is None:
            return
        start = max(ts - max(step_ms, 0.0) / 1e3, self.first_ts)
        if self._step_end is not None:
            start = max(start, self._step_end)
        if ts <= start:
            return
        self._step_end = ts
        if self.first_step_start is None:
            self.first_step_start = start
        if self._restart_from is not None:  # the first step after a restart ends it
            a, self._restart_from = self._restart_from, None
            self._lost["restart"] += max(0.0, (start - a) - self._stalled(a, start))
        self._steps.append((start, ts))
        self._step_count += 1
        useful = (ts - start) - self._stalled(start, ts)
        if n is not None and self._redo_through is not None and n <= self._redo_through:
            self._lost["restart"] += useful
        elif skipped:
            self._lost["skipped"] += useful
        else:
            self.productive_s += useful
        if n is not None and (self._top_step is None or n > self._top_step):
            self._top_step = n

    def _event(self, msg: Any, ts: float) -> None:
        kind = getattr(msg, "kind", "")
        if kind not in ("checkpoint", "switch"):
            return
        data = getattr(msg, "data", None)
        seconds = _real(data.get("seconds")) if isinstance(data, dict) else None
        if seconds is None or seconds <= 0:
            return
        a = max(ts - seconds, self.first_ts, self._handed_over_ts or self.first_ts)
        if ts <= a:
            return
        pieces = [*self._recent_steps(a), *self._stall_pieces(a, ts)]
        self._lost[kind] += max(0.0, (ts - a) - _covered(a, ts, pieces))

    def _stall(self, msg: Any, rank: int, ts: float) -> None:
        state = getattr(msg, "state", "")
        if state == "stalled":
            if rank not in self._open:
                running = _real(getattr(msg, "running_s", None)) or 0.0
                self._open[rank] = max(ts - max(running, 0.0), self.first_ts)
        elif state == "recovered":
            self._end_stall(rank, ts)

    def _end_stall(self, rank: int, ts: float) -> None:
        start = self._open.pop(rank, None)
        if start is None or ts <= start:
            return
        stalls = self._stalls
        i = len(stalls)
        while i > 0 and stalls[i - 1][0] > start:
            i -= 1
        stalls.insert(i, (start, ts))
        # merge around the insertion point
        lo = max(0, i - 1)
        merged: list[tuple[float, float]] = []
        for s, e in stalls[lo:]:
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        stalls[lo:] = merged
        while len(stalls) > STALL_HISTORY:
            s, e = stalls.pop(0)
            self._folded_stall_s += e - s

    # ------------------------------------------------------------------ hand-over

    def state(self) -> GoodputState | None:
        """The count so far, for a counter that starts now (None before the run's first Hello)."""
        if self.first_ts is None:
            return None
        closed = self._folded_stall_s + sum(e - s for s, e in self._stalls)
        startup = self.result().lost_s["startup"] if self.first_step_start is not None else None
        return GoodputState(
            run_id=self.run_id, world_size=self.world_size, started_ts=self.first_ts, as_of_ts=self.last_ts,
            first_step_start_ts=self.first_step_start, step_end_ts=self._step_end, steps=self._step_count,
            productive_s=self.productive_s, checkpoint_s=self._lost["checkpoint"], switch_s=self._lost["switch"],
            skipped_s=self._lost["skipped"], stall_closed_s=closed, startup_s=startup,
            open_stalls=tuple(sorted(self._open.items()))[:MAX_OPEN_STALLS],
            recent_steps=tuple(self._steps)[-HANDED_STEPS:], recent_stalls=tuple(self._stalls[-HANDED_STALLS:]),
            restart_s=self._lost["restart"], restarts=self._restarts, restart_from_ts=self._restart_from,
            redo_through_step=self._redo_through, top_step=self._top_step)

    def _restore(self, msg: Any) -> None:
        """Take a `goodput` message (fields as GoodputState) as the count up to its `as_of_ts`,
        if it is of this run and adds up (goodput_state.checked_state); otherwise ignore it."""
        st = checked_state(msg)
        if st is None or (self.run_id and st.run_id != self.run_id):
            return
        if self.first_ts is not None and st.started_ts > self.first_ts + 1e-6:
            return  # it knows less: a restarted attempt's relay, and this count saw the attempts before
        self._reset(st.run_id or self.run_id)
        if st.world_size:
            self.world_size = st.world_size
        self.first_ts, self.last_ts, first_step = st.started_ts, st.as_of_ts, st.first_step_start_ts
        self.first_step_start, self._step_end, self._step_count = first_step, st.step_end_ts, st.steps
        self.productive_s = st.productive_s
        self._lost.update(checkpoint=st.checkpoint_s, switch=st.switch_s, skipped=st.skipped_s, restart=st.restart_s)
        self._restarts, self._restart_from = st.restarts, st.restart_from_ts
        self._redo_through, self._top_step = st.redo_through_step, st.top_step
        self._steps.extend(st.recent_steps)
        self._stalls = list(st.recent_stalls)
        self._folded_stall_s = st.stall_closed_s - sum(e - s for s, e in st.recent_stalls)
        self._open = dict(st.open_stalls)
        self._handed_over_ts = st.recent_steps[0][0] if st.recent_steps else st.as_of_ts
        self._startup_s = st.startup_s if first_step is not None else None
        self._restored_stall_s = self._folded_stall_s if first_step is None else 0.0
        if first_step is not None:
            self._startup_stalled_s = _covered(st.started_ts, first_step,
                                               [*st.recent_stalls, *((s, st.as_of_ts) for s in self._open.values())])

    # ------------------------------------------------------------------ queries

    def _stall_pieces(self, a: float, b: float) -> list[tuple[float, float]]:
        """Stalls that reach into [a, b] (one in progress lasts until b)."""
        pieces = [(s, b) for s in self._open.values() if s < b]
        for s, e in reversed(self._stalls):
            if e <= a:
                break
            pieces.append((s, e))
        return pieces

    def _stalled(self, a: float, b: float) -> float:
        if not self._open and (not self._stalls or self._stalls[-1][1] <= a):
            return 0.0
        return _covered(a, b, self._stall_pieces(a, b))

    def _recent_steps(self, a: float) -> list[tuple[float, float]]:
        found = []
        for s, e in reversed(self._steps):
            if e <= a:
                break
            found.append((s, e))
        return found

    def result(self) -> GoodputResult:
        if self.first_ts is None:
            return GoodputResult(lost_s=dict.fromkeys(CAUSES, 0.0))
        t0, t1 = self.first_ts, self.last_ts
        wall = max(0.0, t1 - t0)
        lost = dict(self._lost)
        stalls = [*self._stalls, *((s, t1) for s in self._open.values())]
        lost["stall"] = self._folded_stall_s + _covered(t0, t1, stalls)
        startup_end = self.first_step_start if self.first_step_start is not None else t1
        if self._startup_s is not None:
            stalled_since = _covered(t0, startup_end, stalls) - self._startup_stalled_s
            lost["startup"] = max(0.0, self._startup_s - max(0.0, stalled_since))
        else:
            lost["startup"] = max(0.0, (startup_end - t0) - _covered(t0, startup_end, stalls) - self._restored_stall_s)
        if self._restart_from is not None:  # in progress: until the latest message
            a = self._restart_from
            lost["restart"] += max(0.0, (t1 - a) - _covered(a, t1, stalls))
        accounted = self.productive_s + sum(v for k, v in lost.items() if k != "other")
        lost["other"] = max(0.0, wall - accounted)
        return GoodputResult(productive_s=self.productive_s, wall_s=wall, lost_s=lost, steps=self._step_count,
                             restarts=self._restarts)


def goodput_of(messages: Iterable[Any]) -> GoodputResult:
    """The goodput of a finished sequence of messages (e.g. a run's logs, merged in ts order)."""
    g = Goodput()
    for m in messages:
        g.add(m)
    return g.result()
