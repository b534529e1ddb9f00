"""How far behind the run a reader of its messages is: the delay of the newest rank message of each
batch it takes (its wall clock less the message's `ts`), less the smallest such delay seen lately.
The smallest delay is the clocks' offset (a rank on another host) plus the quickest the path has
been, so what is left is the time the messages spent queued (in the relay, the socket, the UI's
receiver) beyond that, with no clock assumed in step with another. The UI's header says it; rank
0's relay skips superseded readings while it is (agent/transport/relay.py)."""

from __future__ import annotations

from collections import deque

BEHIND_AFTER_S = 1.0
"""At this lag or more the header says `behind by N s` instead of `● live`."""
BASELINE_WINDOW_S = 600.0
"""The smallest delay is taken over this long: a lag that lasts longer still shows (a clock that
is stepped needs this long to be forgotten)."""


class Lag:
    def __init__(self) -> None:
        self._lows: deque[tuple[float, float]] = deque()
        """(now, delay) with rising delays: the window's minimum first (a sliding-window minimum)."""
        self.latest_s = 0.0
        self.at: float | None = None

    def observe(self, delay_s: float, now: float) -> None:
        """A batch's newest message was `delay_s` old (UI wall clock - its ts) when folded at `now`
        (the UI's monotonic clock)."""
        lows = self._lows
        while lows and lows[-1][1] >= delay_s:
            lows.pop()
        lows.append((now, delay_s))
        while now - lows[0][0] > BASELINE_WINDOW_S:
            lows.popleft()
        self.latest_s, self.at = delay_s, now

    def behind_s(self) -> float:
        """The latest batch's lag beyond the quickest path (0 before any)."""
        if not self._lows:
            return 0.0
        return max(0.0, self.latest_s - self._lows[0][1])
