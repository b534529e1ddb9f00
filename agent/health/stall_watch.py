"""Notices a rank whose work runs far past its usual time, and says where it is, from its own thread.

The training thread only writes a few attributes as it goes (which loop iteration, which phase):
no lock, no call into anything that could block. The watch thread wakes every `interval_s`,
compares the running iteration with the median of the recent ones, and, past
`factor x median + floor_s` (metrics/rules/liveness.py: the one rule), publishes a `Stall` report every
`repeat_s` while it lasts: the phase,
the collectives in flight from the tracer's ledger, each group's progress, the training thread's
Python stack (`sys._current_frames()`: no signal, no device), and the peers on this host that are
gone. When the iteration ends, it says `recovered`. In start-up (no median yet) it reports where
the rank is already after `startup_s`, as `starting`: a peer waiting for it names it within seconds.

It is also the way out of a rank stuck inside a collective, where Python's signal handlers never
run (they run on the main thread, between bytecodes). A stop signal still writes its number to the
wakeup fd this thread reads; so does a `stop` sent down from rank 0 (`ringtop ctl stop`). If the
training thread has not ended the run `grace_s` later, this thread says goodbye for it (the Bye
names where it was stuck) and ends the process.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import select
import signal
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ringtop.agent.health.peers import Peers
from ringtop.agent.instruments.comm_tracer import CommTracer
from ringtop.metrics.rules import liveness
from ringtop.metrics.rules.hang import STARTING
from ringtop.protocol import Stall
from ringtop.protocol.guard import LoopFaults


@dataclass(frozen=True)
class WatchSettings:
    """When a rank counts as stalled (the defaults and their reasons: metrics/rules/liveness.py), and how
    the watch behaves."""

    factor: float = liveness.STALL_FACTOR
    floor_s: float = liveness.STALL_FLOOR_S
    warmup_s: float = liveness.WARMUP_S
    startup_s: float = liveness.STARTUP_REPORT_S
    command_s: float = liveness.COMMAND_S
    interval_s: float = 0.25
    repeat_s: float = 2.0
    grace_s: float = 3.0
    """A stop (signal or `ctl stop`) the training thread has not acted on after this is done for it."""

    def __post_init__(self) -> None:
        if self.factor < 1 or self.floor_s < 0 or self.interval_s <= 0:
            raise ValueError(f"bad stall watch settings: {self}")


OWN_PACKAGES = ("ringtop", "ringtop.agent", "ringtop.strategies", "ringtop.metrics", "ringtop.protocol", "ringtop.cli",
                "ringtop.tui")
"""Found, not imported: the agent imports no UI."""
HISTORY = liveness.MEDIAN_OF
STDLIB = sysconfig.get_paths()["stdlib"]
_MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
_NOT_WHERE_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, os.sep + "deepspeed" + os.sep)
"""Torch's and DeepSpeed's insides: not where a user would look."""
_OWN_DIRS = tuple(os.path.abspath(d) + os.sep for name in OWN_PACKAGES
                  for spec in [importlib.util.find_spec(name)] if spec is not None
                  for d in spec.submodule_search_locations or ())
_USERS_IN_OWN = frozenset(os.path.join(_MODELS_DIR, name) for name in ("model.py", "hf_models.py", "data.py"))
"""Ringtop's own code is never where a rank is (its loop, hooks, diagnosis, injected faults),
except what an agent run trains in place of a user's program: its models and its data."""


def format_stack(frame: Any, limit: int = 64) -> list[str]:
    """The stack, outermost first, at most `limit` innermost frames, `path:line in function`."""
    frames = traceback.extract_stack(frame)[-limit:]
    return [f"{f.filename}:{f.lineno} in {f.name}"[:300] for f in frames]


def is_users(filename: str) -> bool:
    """A frame of the user's program (or an agent run's model): not the standard library, torch,
    DeepSpeed or ringtop's own machinery."""
    if filename.startswith("<frozen "):  # the standard library's frozen modules (runpy, importlib)
        return False
    path = os.path.abspath(filename)
    if path.startswith(STDLIB) and "site-packages" not in path:
        return False
    if any(part in path for part in _NOT_WHERE_DIRS):
        return False
    return path in _USERS_IN_OWN or not path.startswith(_OWN_DIRS)


def where_in(frame: Any) -> str:
    """The innermost frame of the user's program: `model.py:57 in forward`; empty when the stack
    has none (the phase then says where). The full stack is `format_stack`'s."""
    for f in reversed(traceback.extract_stack(frame)):
        if is_users(f.filename):
            return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
    return ""


class StoppedWhileStuck(Exception):
    """Raised in a stalled training thread that runs Python (a hung data loader, a sleep) when a
    `stop` arrives: it then ends the run the ordinary way. `StallWatch.stuck_reason` says why."""


def _raise_in(thread_id: int, exc_type: type[BaseException]) -> bool:
    """Ask CPython to raise `exc_type` in another thread at its next bytecode (never inside C code:
    a thread waiting in a collective gets it only when the wait returns)."""
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type)) == 1


class StallWatch(threading.Thread):
    def __init__(self, tracer: CommTracer | None, emit: Callable[[Stall], None], peers: Peers | None = None,
                 settings: WatchSettings | None = None, training_thread: int | None = None,
                 escape: Callable[[str], None] | None = None) -> None:
        """`escape(reason)`: ends the process when the training thread cannot (see the module
        docstring); None: never."""
        super().__init__(name="ringtop-stall-watch", daemon=True)
        self.settings = settings or WatchSettings()
        self._tracer = tracer
        self._emit = emit
        self._peers = peers
        self._escape = escape
        self._thread_id = training_thread if training_thread is not None else threading.get_ident()
        self._stop_event = threading.Event()
        self.faults = LoopFaults("stall watch")
        # written by the training thread, read here
        self._iteration = 0
        self._began = 0.0
        self._step = 0
        self._phase = "start-up"
        self._generous = False
        self._active = False
        self._history: deque[float] = deque(maxlen=HISTORY)
        # the watch's own state
        self._reported_iteration = -1
        self._last_report = 0.0
        self._stop_requested: tuple[str, float, bool] | None = None
        """(reason, since, only if stalled)."""
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._previous_wakeup: int | None = None
        self._interrupted = False
        self.stuck_reason = ""
        self.stuck_place = ""
        """Why a StoppedWhileStuck was raised in the training thread, and where it was stuck."""
        self.reports = 0

    # ------------------------------------------------------------------ training thread

    def iteration(self, step: int, phase: str) -> None:
        """A loop iteration begins, to run step `step`, with `phase`."""
        now = time.monotonic()
        if self._active and not self._generous and self._iteration:
            self._history.append(now - self._began)
        self._iteration += 1
        self._step, self._phase, self._generous = step, phase, False
        self._began = now
        self._active = True

    def setting_up(self, step: int, phase: str) -> None:
        """Before the loop's first iteration (what the run does between its set-up collectives and
        its first step): watched as start-up, so a rank stuck here is placed for the peers that wait
        at step `step`'s boundary; no iteration, so nothing enters the history."""
        self._step, self._phase, self._generous = step, phase, False
        self._began = time.monotonic()
        self._active = True

    def phase(self, name: str) -> None:
        self._phase = name

    def generous(self, phase: str) -> None:
        """This iteration applies a command or writes a checkpoint: allow it `command_s` more."""
        self._phase, self._generous = phase, True

    def between(self) -> None:
        """An iteration ended and a loop ringtop does not own does its own things until the next
        (evaluation, logging): the iteration counts toward the history; nothing is watched meanwhile."""
        if self._active and not self._generous and self._iteration:
            self._history.append(time.monotonic() - self._began)
        self._active = False

    def idle(self) -> None:
        """Outside the loop (set-up, shutdown): nothing to watch."""
        self._active = False

    # ------------------------------------------------------------------ any thread

    def catch_stop_signals(self) -> None:
        """From the main thread: stop signals also wake this thread (their Python handlers may never
        run while the main thread waits inside a collective)."""
        if threading.current_thread() is threading.main_thread():
            self._previous_wakeup = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

    def request_stop(self, reason: str, only_if_stalled: bool = False) -> None:
        """A stop the training thread should act on soon: a signal (its handler may never run), or a
        `stop` command (`only_if_stalled`: a healthy loop applies it at its next step boundary)."""
        if self._stop_requested is None:
            self._stop_requested = (reason, time.monotonic(), only_if_stalled)

    def _median_s(self) -> float | None:
        return liveness.median_step_s(list(self._history))  # one C-level copy: the training thread appends

    def _limit_s(self, median_s: float | None) -> float:
        s = self.settings
        return liveness.stall_after_s(median_s, generous=self._generous, factor=s.factor, floor_s=s.floor_s,
                                      warmup_s=s.warmup_s, command_s=s.command_s)

    def threshold_s(self) -> float:
        return self._limit_s(self._median_s())

    def report(self, state: str = "snapshot", request: str = "") -> Stall:
        """Where the training thread is now; safe from any thread, never waits for it."""
        now = time.monotonic()
        frame = sys._current_frames().get(self._thread_id)
        tracer = self._tracer
        return Stall(
            state=state, request=request, step=self._step, phase=self._phase if self._active else "outside the loop",
            running_s=max(0.0, now - self._began) if self._active else 0.0, threshold_s=self.threshold_s(),
            where=where_in(frame) if frame is not None else "", stack=format_stack(frame) if frame is not None else [],
            in_flight=tracer.in_flight_ops() if tracer is not None else [],
            groups=tracer.cursors() if tracer is not None else [],
            gone_peers=self._peers.gone() if self._peers is not None else [],
        )

    def cancel_interrupt(self) -> None:
        """From the training thread as it shuts down: a StoppedWhileStuck still pending (its wait
        ended in an error first) must not cut the shutdown short."""
        if self._interrupted and threading.get_ident() == self._thread_id:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)

    def stuck_at(self) -> str:
        """`while stuck at step 5 in backward at model.py:57 in forward, inside all_reduce #8 on group world`."""
        where = self.report("stalled")
        text = f"while stuck at step {where.step} in {where.phase}" + (f" at {where.where}" if where.where else "")
        inside = next((f"{op.kind} #{op.seq} on group {op.group}" for op in where.in_flight), "")
        return text + (f", inside {inside}" if inside else "")

    def stop(self, timeout_s: float = 2.0) -> None:
        if self._previous_wakeup is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_wakeup)  # first: no signal may write to a closed fd
            self._previous_wakeup = None
        self._stop_event.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)
        elif self.ident is None:  # never started: its thread would have closed them
            for s in (self._wake_r, self._wake_w):
                s.close()

    # ------------------------------------------------------------------ the thread

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    readable, _, _ = select.select([self._wake_r], [], [], self.settings.interval_s)
                    if readable:
                        self._read_wakeups()
                    if self._stop_event.is_set():
                        return
                    self._tick(time.monotonic())
                except Exception as exc:  # never let the watch die: say so (a few a minute), back off, keep watching
                    self.faults.record(exc)
        finally:
            for s in (self._wake_r, self._wake_w):
                s.close()

    def _read_wakeups(self) -> None:
        try:
            data = self._wake_r.recv(64)
        except (BlockingIOError, OSError):
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.request_stop(f"interrupted: {signal.Signals(signum).name}")

    def _tick(self, now: float) -> None:
        median_s = self._median_s()
        threshold_s = self._limit_s(median_s)
        report_after_s = liveness.report_after_s(median_s, threshold_s, self.settings.startup_s, self._generous)
        stalled = self._active and now - self._began > threshold_s
        starting = not stalled and self._active and now - self._began > report_after_s
        reporting = stalled or starting
        if self._stop_requested is not None and self._escape is not None:
            reason, since, only_if_stalled = self._stop_requested
            if only_if_stalled and stalled and not self._interrupted:
                self.stuck_place = self.stuck_at()
                self.stuck_reason = f"{reason} {self.stuck_place}"
                self._interrupted = _raise_in(self._thread_id, StoppedWhileStuck)
            if now - since >= self.settings.grace_s and (stalled or not only_if_stalled):
                self._stop_requested = None
                self._escape(reason)
                return
        if not self._active:
            return
        due = self._reported_iteration != self._iteration or now - self._last_report >= self.settings.repeat_s
        if reporting and due:
            self._reported_iteration, self._last_report = self._iteration, now
            self.reports += 1
            self._emit(self.report("stalled" if stalled else STARTING))
        elif not reporting and self._reported_iteration >= 0 and self._reported_iteration != self._iteration:
            self._reported_iteration = -1
            self._emit(Stall(state="recovered", step=self._step, phase=self._phase))
