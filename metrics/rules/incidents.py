"""Incidents: what an alert is about. A stream of signals (a hang named, a rank dead, a desync, a
non-finite step, a loss spike, a long stall, goodput under its floor; and their ends) becomes one
notice when an incident opens and one when it resolves — never one per restatement. Pure and
torch-free: rank 0's alerts feed it what its relay forwards (agent/alerts.py).

An incident is keyed by its kind: while a hang is open, a second hang verdict (another culprit,
the same stall restated every few seconds) is the same incident, updated, not re-announced. A
kind that has no end of its own (a dead rank, a desync) resolves when the run ends. Notices are
rate-limited as a whole (`max_per_window` in `window_s`): past that they are counted, not sent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

KINDS = ("hang", "death", "desync", "nonfinite", "loss_spike", "stall", "goodput")
ENDS_WITH_THE_RUN = ("death", "desync")
"""Kinds that have no recovery of their own: resolved when the run ends."""
SPIKE_QUIET_STEPS = 20
"""A loss spike is over after this many steps without another."""


@dataclass(frozen=True)
class Signal:
    """One reading that opens (or updates) an incident of `kind`, or ends it (`opening` False)."""

    kind: str
    opening: bool
    text: str
    ranks: tuple[int, ...] = ()
    step: int = -1


@dataclass(frozen=True)
class Notice:
    """What an alert says: an incident `opened` or `resolved`."""

    action: str
    kind: str
    text: str
    ranks: tuple[int, ...]
    step: int
    ts: float
    opened_ts: float
    """When the incident opened (for a resolution: how long it lasted)."""


@dataclass
class _Open:
    signal: Signal
    since: float
    updates: int = 0


@dataclass
class Incidents:
    max_per_window: int = 20
    window_s: float = 3600.0
    open: dict[str, _Open] = field(default_factory=dict)
    sent: deque = field(default_factory=deque)
    suppressed: int = 0
    """Notices the rate limit held back."""

    def _allow(self, now: float) -> bool:
        while self.sent and now - self.sent[0] > self.window_s:
            self.sent.popleft()
        if len(self.sent) >= self.max_per_window:
            self.suppressed += 1
            return False
        self.sent.append(now)
        return True

    def feed(self, signal: Signal, now: float) -> list[Notice]:
        """The notices `signal` makes (none, or one)."""
        current = self.open.get(signal.kind)
        if signal.opening:
            if current is not None:
                current.updates += 1
                current.signal = signal
                return []
            self.open[signal.kind] = _Open(signal, now)
            return self._notice("opened", signal, now, now)
        if current is None:
            return []
        del self.open[signal.kind]
        return self._notice("resolved", Signal(signal.kind, False, signal.text or current.signal.text,
                                               current.signal.ranks, signal.step), now, current.since)

    def run_ended(self, text: str, step: int, now: float) -> list[Notice]:
        """Every open incident resolves: the run is over."""
        out = []
        for kind in list(self.open):
            out += self.feed(Signal(kind, False, f"{text} (the incident ends with the run)", step=step), now)
        return out

    def _notice(self, action: str, signal: Signal, now: float, since: float) -> list[Notice]:
        if not self._allow(now):
            return []
        return [Notice(action, signal.kind, signal.text, signal.ranks, signal.step, now, since)]


@dataclass
class SpikeWatch:
    """A loss spike's end: `SPIKE_QUIET_STEPS` steps of rank 0 after the last spike."""

    last_spike_step: int | None = None

    def spiked(self, step: int) -> None:
        self.last_spike_step = step

    def over(self, step: int) -> bool:
        if self.last_spike_step is not None and step - self.last_spike_step >= SPIKE_QUIET_STEPS:
            self.last_spike_step = None
            return True
        return False


@dataclass
class FloorWatch:
    """A reading under its floor opens an incident; it resolves once back above the floor plus a
    margin (no flapping on a value that hovers at the floor)."""

    floor: float
    margin: float = 0.02
    under: bool = False

    def crossed(self, value: float) -> bool | None:
        """True when it went under, False when it came back, None when nothing changed."""
        if not self.under and value < self.floor:
            self.under = True
            return True
        if self.under and value >= self.floor + self.margin:
            self.under = False
            return False
        return None
