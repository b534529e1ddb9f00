"""One rank as every surface folds it (the UI's row, the Prometheus exporter, `summary`): what its
messages said last, how it ended, and the whole run's totals of its steps.

Pure and torch-free; messages are duck-typed (protocol structs, read by their fields), as
metrics/goodput.py reads them. The UI's row (`tui/state/rank_row.RankRow`) is this state with the
screen's own fields beside it, so a figure it shows is the one the exporter exports and `summary`
prints: the same field, set by the same method.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ringtop.metrics.run_lifecycle import RankEnd
from ringtop.metrics.timing import STEP_WINDOW, share_pct

MAX_KINDS_PER_RANK = 32
"""Collective kinds counted apart per rank; the rest add up under `other` (a forged stream of kinds
never grows the state, nor an exporter's label sets)."""
OTHER_KIND = "other"


@dataclass(slots=True)
class RankState:
    rank: int
    hello: Any = None
    """Its latest Hello (its run id, strategy, device's peak)."""
    host: str = ""
    pid: int = 0
    peak_tflops: float = 0.0
    """From its Hello: its device's dense peak; 0 = not known."""
    said_hello: bool = False
    hello_ts: float = 0.0
    last_seq: int | None = None
    # its latest step
    step: int = -1
    """The furthest step it reached: its steps, heartbeats and Bye (a resumed run: its start step)."""
    loss: float = math.nan
    """The latest step's loss; NaN: not finite (or no step yet)."""
    step_ms: float = math.nan
    data_ms: float = 0.0
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    exposed_comm_ms: float = 0.0
    latest: Any = None
    """The latest Step (the last to arrive): what only a Step carries is read from it."""
    step_seen: float | None = None
    """The caller's clock when its latest Step arrived; None: none since the run (re)started."""
    folded_step: int = -1
    """The newest step folded into its histories and totals: a step that comes again is counted once."""
    agent_drops: int = 0
    """Messages the agent says it dropped (its bounded queue overflowed, or a send failed)."""
    step_ms_history: deque = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    """Its latest step times, oldest first (at least STEP_WINDOW of them): the windowed step time."""
    # how it ended
    ended: bool = False
    """It said Bye."""
    bye_ts: float = 0.0
    bye_ok: bool = True
    bye_reason: str = ""
    dead: bool = False
    """Ended without a Bye, as learnt otherwise (its silence, the launcher, the end of its log)."""
    exit_how: str = ""
    """Of a rank ended without a Bye: how (`killed by SIGKILL`); empty: only that it ended."""
    exit_detail: str = ""
    ended_at: float | None = None
    """The caller's clock at its end: which failure came first."""
    stuck: str = ""
    """Silent, its process seen alive from outside, in words; empty: not so."""
    # the whole run's totals (every step folded once; a restarted attempt's steps again)
    timed_steps: int = 0
    first_loss: float = math.nan
    step_ms_total: float = 0.0
    exposed_comm_ms_total: float = 0.0
    """Milliseconds the training thread waited on collectives (never taken back: a counter)."""
    comm_bytes_total: int = 0
    comm_bytes_by_kind: dict = field(default_factory=dict)
    """Collective kind -> bytes handed to it (at most MAX_KINDS_PER_RANK kinds, then `other`)."""
    whole_run: list | None = None
    """(step ms, TFLOP/s) of every step folded, for the whole run's medians; None: not kept (a live
    surface keeps only its windows)."""

    # ------------------------------------------------------------------ the rules, one per message

    def take_hello(self, msg: Any) -> None:
        self.hello = msg
        self.said_hello = True
        self.host = msg.host or self.host
        self.pid = msg.pid or self.pid
        self.peak_tflops = msg.peak_tflops
        if msg.start_step and self.step < 0:
            self.step = msg.start_step

    def rejoin(self, msg: Any) -> tuple[bool, bool]:
        """(its first Hello, a new process of it) for a Hello: a new process (another pid, or a newer
        Hello that starts the sequence again) forgets how the old one ended. The relay sends its
        cached Hello again to each new subscriber: that copy is no restart."""
        first = not self.said_hello
        if self.pid and msg.pid:
            restarted = not first and msg.pid != self.pid
        else:
            restarted = not first and msg.ts > self.hello_ts and (self.last_seq is None or msg.seq <= self.last_seq)
        if restarted:
            self.agent_drops = 0
            self.forget_end()
        if first or restarted:
            self.last_seq = None
            self.folded_step = -1
            self.hello_ts = msg.ts
        return first, restarted

    def take_step(self, msg: Any, now: float) -> None:
        """A whole Step's own figures, as the latest."""
        self.step_seen = now
        loss = msg.loss
        self.loss = math.nan if loss is None else loss
        self.step_ms = msg.step_ms
        self.data_ms = msg.data_ms
        self.forward_ms = msg.forward_ms
        self.backward_ms = msg.backward_ms
        self.optimizer_ms = msg.optimizer_ms
        self.exposed_comm_ms = msg.exposed_comm_ms
        self.latest = msg
        if msg.drops > self.agent_drops:
            self.agent_drops = msg.drops

    def fold_step(self, step: int, step_ms: float) -> None:
        """What every step adds once, whole or a digest's brief of it: how far the rank got, its
        step times."""
        self.folded_step = step
        if step > self.step:
            self.step = step
        if math.isfinite(step_ms):
            self.step_ms_history.append(step_ms)

    def count_step(self, msg: Any) -> None:
        """A whole Step into the run's totals (once per step: after `fold_step`'s check)."""
        if self.timed_steps == 0:
            self.first_loss = math.nan if msg.loss is None else msg.loss
        self.timed_steps += 1
        self.step_ms_total += msg.step_ms
        self.exposed_comm_ms_total += max(0.0, msg.exposed_comm_ms)
        kinds = self.comm_bytes_by_kind
        for c in msg.comm:
            kind = c.kind if c.kind in kinds or len(kinds) < MAX_KINDS_PER_RANK else OTHER_KIND
            kinds[kind] = kinds.get(kind, 0) + c.bytes
            self.comm_bytes_total += c.bytes
        if self.whole_run is not None:
            self.whole_run.append((msg.step_ms, msg.tflops))

    def take_heartbeat(self, msg: Any) -> None:
        if msg.step > self.step:
            self.step = msg.step
        self.agent_drops = max(self.agent_drops, msg.drops)

    def take_bye(self, msg: Any, now: float) -> bool:
        """Its Bye; False for one already taken (the relay's cached copy, sent to a new subscriber)."""
        if self.ended and msg.ts <= self.bye_ts:
            return False
        self.bye_ts = msg.ts
        self.ended = True
        self.ended_at = now
        self.bye_reason = msg.reason or ("finished" if msg.ok else "failed")
        self.bye_ok = msg.ok
        if msg.step > self.step:
            self.step = msg.step
        return True

    def take_exit(self, how: str, detail: str, at: float) -> None:
        """Ended without a Bye: `how` and `detail` as far as they are known, `at` on the caller's clock."""
        self.dead, self.exit_how, self.exit_detail, self.ended_at = True, how, detail, at

    def forget_end(self) -> None:
        """A new process of the rank: how the old one ended, and how far it got, no longer stand."""
        self.ended, self.bye_reason, self.bye_ok, self.bye_ts = False, "", True, 0.0
        self.dead, self.exit_how, self.exit_detail = False, "", ""
        self.step = -1

    # ------------------------------------------------------------------ readings

    @property
    def over(self) -> bool:
        """It said Bye or is known to have ended without one."""
        return self.ended or self.dead

    def end(self, how_silent: str = "", detail_silent: str = "") -> RankEnd | None:
        """How it ended, as the run's lifecycle reads it (metrics/run_lifecycle.py); None while it
        runs. `how_silent`, `detail_silent`: the words for an end without a Bye whose how is not known."""
        if not self.over:
            return None
        return RankEnd(self.rank, self.step, None if self.dead else self.bye_ok, self.bye_reason,
                       self.exit_how or how_silent, self.exit_detail or detail_silent,
                       self.ended_at if self.ended_at is not None else math.inf)

    def recent_step_ms(self, window: int = STEP_WINDOW) -> float:
        """The step time every live surface shows for the rank: the mean of its last `window` steps
        (metrics.timing.STEP_WINDOW), summed oldest first; NaN before a step."""
        if not self.step_ms_history:
            return math.nan
        pts = list(islice(reversed(self.step_ms_history), window))
        pts.reverse()
        return sum(pts) / len(pts)

    @property
    def exposed_comm_pct(self) -> float:
        """The whole run's exposed communication over its step time, in percent."""
        return share_pct(self.exposed_comm_ms_total, self.step_ms_total)

    @property
    def median_step_ms(self) -> float:
        """The whole run's median step time, after its first step (which warms up); NaN when not kept."""
        times = [ms for ms, _ in self.whole_run or ()]
        return statistics.median(times[1:] or times) if times else math.nan

    @property
    def median_tflops(self) -> float:
        """The whole run's median TFLOP/s after the first step, of the steps that report one; 0: none."""
        pts = self.whole_run or []
        found = [t for _, t in (pts[1:] or pts) if t > 0]
        return statistics.median(found) if found else 0.0
