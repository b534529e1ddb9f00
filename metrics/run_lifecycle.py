"""One run's lifecycle, defined once for every surface (header, health line, commands, CLI,
`summary`, Prometheus): starting → live → stalled → ended (completed) / stopped (by whom) /
failed (which rank, how, at which step).

Pure and torch-free: a fold of what is known of each rank's end (its Bye, or how it ended without
one) into one state and its words. A Bye with ok=False is not by itself a failure: a stop signal
(Ctrl-C, a scheduler's SIGTERM) ends every rank that way, and it is a user's stop unless some rank
failed for a reason of its own (an error, a death), which then is the run's cause.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from typing import Iterable

STARTING, LIVE, STALLED = "starting", "live", "stalled"
ENDED, STOPPED, FAILED = "ended", "stopped", "failed"
RESTARTING = "restarting"
"""Every rank ended and one failed, but the launcher has restarts left: it starts them again."""
STATES = (STARTING, LIVE, STALLED, RESTARTING, ENDED, STOPPED, FAILED)
FINAL = frozenset((ENDED, STOPPED, FAILED))
"""States after which the run takes no command."""

STOP_FROM_UI = "from the UI"
"""The `stop` command's reason when the UI sends it (the Bye then says `stopped by user: from the UI`)."""
STOP_FROM_CTL = "ctl stop"
"""…and when `ringtop ctl stop` sends it without a reason of the user's own."""
USER_STOP_PREFIX = "stopped by user"
"""How rank 0's Bye begins after a `stop` command (agent/loop/commands.py)."""
INTERRUPTED_PREFIX = "interrupted: "
"""How a rank's Bye begins when a signal ended its loop (`interrupted: SIGTERM …`)."""
STOP_SIGNALS = {"SIGINT": "Ctrl-C", "SIGTERM": "SIGTERM", "SIGHUP": "SIGHUP (the session closed)"}
"""The signals that stop a run on a user's (or a scheduler's) behalf, and who sent each, in words:
`ringtop run` passes Ctrl-C on to the ranks as SIGINT, anything else stops them with SIGTERM."""
ENDED_SIGNAL_EXIT = 128
"""A process ended by signal N exits 128 + N (a shell's convention, `ringtop run`'s too)."""


@dataclass(frozen=True, slots=True)
class RankEnd:
    """What is known of how one rank ended."""

    rank: int
    step: int = -1
    ok: bool | None = None
    """Its Bye's `ok`; None: it ended without a Bye (killed, crashed, or not heard since)."""
    reason: str = ""
    """Its Bye's reason."""
    how: str = ""
    """Without a Bye: how it ended as far as it is known (`killed by SIGKILL`, `exited with code 1`,
    `died`); empty: only that it ended without a Bye."""
    detail: str = ""
    """Without a Bye: how that is known (`no message for 4 s`, `its process is gone`)."""
    at: float = math.inf
    """When (any one clock for all ranks): the earliest failure is the run's cause."""

    @property
    def stopped_by(self) -> str:
        """Who stopped this rank ('Ctrl-C', 'the UI', 'ctl stop', 'SIGTERM', a user's reason); '' if
        it was not stopped."""
        return stop_source(self.reason) if self.ok is not None else ""

    @property
    def failed(self) -> bool:
        return self.ok is None or (not self.ok and not self.stopped_by)


@dataclass(frozen=True, slots=True)
class Lifecycle:
    state: str
    words: str = ""
    """The state in a user's words: `completed 100 steps`, `stopped by Ctrl-C at step 40`,
    `rank 0 killed by SIGKILL at step 12`."""
    by: str = ""
    """Of a stop: who stopped it."""
    rank: int | None = None
    """Of a failure: the rank that failed first."""
    step: int = -1
    cause: str = ""
    """Of a failure (also one the launcher restarts from): what failed first, in words."""

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def exit_code(self) -> int:
        """`ringtop run`'s exit status for this end: 0 completed or stopped by a command, 130 for
        Ctrl-C (128 + the signal for another stop signal), 1 failed; 0 while it is not over."""
        if self.state == FAILED:
            return 1
        if self.state == STOPPED:
            for name, who in STOP_SIGNALS.items():
                if who == self.by:
                    return ENDED_SIGNAL_EXIT + int(signal.Signals[name])
        return 0


def stop_source(reason: str) -> str:
    """Who a Bye's reason says stopped the rank, in words; '' when the reason is not a stop."""
    text = reason.strip()
    if text.startswith(USER_STOP_PREFIX):
        said = text[len(USER_STOP_PREFIX):].lstrip(": ").strip()
        while said.startswith(USER_STOP_PREFIX):  # `stopped by user: stopped by user` (the default)
            said = said[len(USER_STOP_PREFIX):].lstrip(": ").strip()
        said = said.split("while stuck")[0].strip()  # where a stuck rank was stopped is not who
        if said.startswith(STOP_FROM_UI):
            return "the UI"
        return said or STOP_FROM_CTL
    if text.startswith(INTERRUPTED_PREFIX):
        name = text[len(INTERRUPTED_PREFIX):].split()[0] if text[len(INTERRUPTED_PREFIX):].split() else ""
        return STOP_SIGNALS.get(name, "")
    return ""


def rank_end_of(rank: int, messages: list, how_silent: str) -> RankEnd:
    """A rank's end as its messages (a log, or one attempt of it) tell it: its last message a Bye,
    or not (then `how_silent`). Messages duck-typed by their protocol tag, as metrics/goodput.py."""
    last_step = max((m.step for m in messages if _tag(m) == "step"), default=-1)
    last = messages[-1] if messages else None
    if last is not None and _tag(last) == "bye":
        return RankEnd(rank, max(last.step, last_step), last.ok, last.reason, at=last.ts)
    return RankEnd(rank, last_step, None, how=how_silent, at=last.ts if last is not None else 0.0)


def _tag(msg) -> str:
    return getattr(getattr(type(msg), "__struct_config__", None), "tag", "") or ""


def end_words(end: RankEnd) -> str:
    """One rank's failure in words: `rank 0 killed by SIGKILL at step 12`, `rank 1: error: …`."""
    if end.ok is None:
        at = f" at step {end.step}" if end.step >= 0 else ""
        detail = f" ({end.detail})" if end.detail else ""
        return f"rank {end.rank} {end.how or 'ended without a Bye'}{at}{detail}"
    return f"rank {end.rank}: {' '.join(end.reason.split()) or 'failed'}"


def _cause_order(end: RankEnd) -> tuple:
    """A rank ended without a Bye went first (its peers' errors are what its death caused them),
    one killed by a signal that is not a stop before one only found silent; then the earliest."""
    silent = end.ok is None
    killed = silent and end.how.startswith("killed by") and not any(s in end.how for s in STOP_SIGNALS)
    return (not silent, not killed, end.at, end.rank)


def fold(ends: Iterable[RankEnd], *, world_size: int, running: int = 0, heard: bool = True,
         stepped: bool = True, stalled: Iterable[int] = (), stuck: Iterable[int] = (),
         restarts_left: int = 0) -> Lifecycle:
    """The run's lifecycle from the ends known so far. `world_size`: ranks in the run (0: only
    those known); `running`: ranks heard and not ended; `heard`: any message came at all;
    `stepped`: any rank finished a step; `stalled`: ranks found stalled or dead while the run goes
    on; `stuck`: ranks silent whose process is alive, named first (the others wait for them);
    `restarts_left`: restarts the launcher still allows (a failure is then `restarting`)."""
    ends = list(ends)
    over = bool(ends) and running == 0 and (world_size <= 0 or len(ends) >= world_size)
    if not over:
        if not heard:
            return Lifecycle(STARTING, "waiting for the first rank")
        first = set(stuck)
        lost = sorted(set(stalled) | first | {e.rank for e in ends if e.failed}, key=lambda r: (r not in first, r))
        if lost:
            return Lifecycle(STALLED, f"rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost[:8]))} "
                                      "not stepping", rank=lost[0])
        if not stepped:
            return Lifecycle(STARTING, "no step finished yet")
        return Lifecycle(LIVE, "stepping")
    step = max((e.step for e in ends), default=-1)
    failed = sorted((e for e in ends if e.failed), key=_cause_order)
    if failed:
        first = failed[0]
        cause = end_words(first)
        if restarts_left > 0:
            left = f"{restarts_left} restart{'s' if restarts_left > 1 else ''} left"
            return Lifecycle(RESTARTING, f"{cause}; the launcher starts every rank again ({left})",
                             rank=first.rank, step=first.step, cause=cause)
        return Lifecycle(FAILED, cause, rank=first.rank, step=first.step, cause=cause)
    stops = sorted((e for e in ends if e.stopped_by), key=lambda e: (e.at, e.rank))
    at = f" at step {step:,}" if step >= 0 else ""
    if stops:
        who = stops[0].stopped_by
        return Lifecycle(STOPPED, f"stopped by {who}{at}", by=who, step=step)
    return Lifecycle(ENDED, f"completed {step:,} steps" if step >= 0 else "completed", step=step)
