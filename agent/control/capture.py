"""`--capture-on spike,straggler,stall`: when such a verdict is raised, rank 0 profiles the next few
steps of the suspect ranks and of one healthy rank to compare them with (`profile` with `ranks`),
at most once every `--capture-every` minutes. The traces land in the run folder's profile/, where
`ringtop trace` merges them into the run's timeline.

A relay observer, on the relay's thread: it reads the verdicts as they are forwarded and queues
the profile as a command of the run's own (ControlServer.inject), applied at a step boundary on
every rank like a client's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ringtop.protocol import Event

TRIGGERS = ("spike", "straggler", "stall")


@dataclass(frozen=True)
class CaptureSettings:
    on: tuple[str, ...] = ()
    every_min: float = 10.0
    steps: int = 3

    def __post_init__(self) -> None:
        unknown = [t for t in self.on if t not in TRIGGERS]
        if unknown:
            raise ValueError(f"--capture-on {','.join(unknown)}: each one of {', '.join(TRIGGERS)}")
        if self.every_min < 0:
            raise ValueError(f"--capture-every {self.every_min:g}: minutes >= 0")
        if not 1 <= self.steps <= 100:
            raise ValueError(f"--capture-steps {self.steps}: 1..100")


def suspects_of(msg: Any) -> tuple[str, list[int], str] | None:
    """(trigger, suspect ranks, what was raised) of an event that can trigger a capture."""
    if not isinstance(msg, Event):
        return None
    if msg.kind == "loss_spike":
        return "spike", [msg.rank], msg.text
    if msg.kind == "verdict" and msg.data.get("rule") == "straggler":
        ranks = [r for r in msg.data.get("ranks", []) if isinstance(r, int) and r >= 0]
        return ("straggler", ranks, msg.text) if ranks else None
    if msg.kind == "hang" and msg.hang is not None and msg.hang.verdict == "stall" and msg.hang.culprits:
        return "stall", list(msg.hang.culprits), msg.text
    return None


class CaptureTrigger:
    def __init__(self, settings: CaptureSettings, world_size: int, inject: Callable[[str, dict[str, Any]], bool],
                 say: Callable[[str, str, str, dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.world_size, self.inject, self.say, self.clock = settings, world_size, inject, say, clock
        self.last: float | None = None
        self.captures = 0
        self.held_back = 0
        """Triggers inside the `every_min` window after a capture: not profiled."""

    def observe(self, msg: Any) -> None:
        found = suspects_of(msg)
        if found is None or found[0] not in self.settings.on:
            return
        trigger, suspects, text = found
        now = self.clock()
        if self.last is not None and now - self.last < self.settings.every_min * 60:
            self.held_back += 1
            return
        suspects = sorted({r for r in suspects if r < self.world_size})
        healthy = next((r for r in range(self.world_size) if r not in suspects), None)
        ranks = suspects + ([healthy] if healthy is not None else [])
        reason = f"capture on {trigger}: {text}"[:200]
        if self.inject("profile", {"steps": self.settings.steps, "ranks": ranks, "reason": reason}):
            self.last = now
            self.captures += 1
            if self.say is not None:
                self.say("info", "capture", f"{reason}; profiling ranks {', '.join(map(str, ranks))} "
                         f"for {self.settings.steps} steps", {"trigger": trigger, "ranks": ranks})
