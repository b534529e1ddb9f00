"""Splits a step into data / forward / backward / optimizer time without synchronising the device.

On CPU the marks are host wall times. On CUDA each mark also records an event; a step's device
phase times are read only once its last event has completed (`Event.query()`), so a step's record
may be published a step or two late rather than stalling the training thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

PHASES = ("data", "forward", "backward", "optimizer")


@dataclass
class StepTiming:
    step_ms: float
    phase_ms: dict[str, float] = field(default_factory=dict)
    started_ns: int = 0
    """When the step began (perf_counter ns): the origin of its collectives' times."""


@dataclass
class _CudaMarks:
    events: list[tuple[str, torch.cuda.Event]]


class StepClock:
    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._t0 = 0
        self._last = 0
        self._host: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event]] = []

    def begin(self) -> None:
        self._t0 = self._last = time.perf_counter_ns()
        self._host = {}
        self._events = []
        if self._cuda:
            self._record("begin")

    def mark(self, phase: str) -> None:
        now = time.perf_counter_ns()
        self._host[phase] = self._host.get(phase, 0.0) + (now - self._last) / 1e6
        self._last = now
        if self._cuda and phase != "data":
            self._record(phase)

    def _record(self, name: str) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.append((name, event))

    def finish(self) -> tuple[StepTiming, _CudaMarks | None]:
        step_ms = (time.perf_counter_ns() - self._t0) / 1e6
        timing = StepTiming(step_ms=step_ms, phase_ms=dict(self._host), started_ns=self._t0)
        return timing, (_CudaMarks(self._events) if self._cuda else None)


def device_phases_ready(marks: _CudaMarks | None) -> bool:
    return marks is None or marks.events[-1][1].query()


def device_begin(marks: _CudaMarks | None) -> torch.cuda.Event | None:
    """The step's first event on the compute stream (its device time origin); None on CPU."""
    return marks.events[0][1] if marks is not None and marks.events else None


def apply_device_phases(timing: StepTiming, marks: _CudaMarks | None) -> StepTiming:
    """Replace host times of device phases with event-measured ones (call only when ready)."""
    if marks is None:
        return timing
    for (_, start), (name, end) in zip(marks.events, marks.events[1:]):
        timing.phase_ms[name] = start.elapsed_time(end)
    return timing
