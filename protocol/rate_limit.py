"""How many control frames a peer may send: a token bucket per peer, and one for all peers together.

A flood of authenticated frames (20k in 0.6 s) was answered and re-published frame by frame and
slowed rank 0's steps 1.6-4x. With these buckets a peer past its burst gets one `busy` reply, then
nothing at all (no decode, no reply, no publish) until its bucket is full again: BURST / RATE_PER_S
= 2 s after the refusal, since ignored frames take no tokens. The time comes in as an argument, so
every rule is checked without a clock."""

from __future__ import annotations

import enum
from collections import OrderedDict

RATE_PER_S = 50.0
"""Frames a peer may send per second, sustained (a UI sends a few)."""
BURST = 100
"""Frames a peer may send at once; a refused peer is heard again once its bucket is this full."""
TOTAL_RATE_PER_S = 400.0
"""All peers together, so that many connections do not add up to a flood."""
TOTAL_BURST = 800
MAX_PEERS = 1024
"""Buckets kept; the least recently heard peer's is forgotten first (it starts full again)."""


class Verdict(enum.Enum):
    PASS = "pass"
    """Handle the frame."""
    BUSY = "busy"
    """Refuse it with one `busy` reply: the first frame over the limit."""
    DROP = "drop"
    """Ignore it: the peer was told it is busy and has not waited for its bucket to refill."""


class TokenBucket:
    """`capacity` tokens, `rate_per_s` added back per second; a frame takes one."""

    __slots__ = ("rate_per_s", "capacity", "tokens", "_last_s")

    def __init__(self, rate_per_s: float, capacity: float, now_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self.tokens = float(capacity)
        self._last_s = now_s

    def refill(self, now_s: float) -> float:
        if now_s > self._last_s:
            self.tokens = min(self.capacity, self.tokens + (now_s - self._last_s) * self.rate_per_s)
            self._last_s = now_s
        return self.tokens

    def take(self, now_s: float) -> bool:
        if self.refill(now_s) >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class PeerLimiter:
    """The verdict on each frame of each peer (a ROUTER's routing id)."""

    def __init__(self, rate_per_s: float = RATE_PER_S, burst: int = BURST, total_rate_per_s: float = TOTAL_RATE_PER_S,
                 total_burst: int = TOTAL_BURST, max_peers: int = MAX_PEERS) -> None:
        self.rate_per_s, self.burst, self.max_peers = rate_per_s, burst, max_peers
        self.total_rate_per_s, self.total_burst = total_rate_per_s, total_burst
        self._total: TokenBucket | None = None
        self._peers: OrderedDict[bytes, TokenBucket] = OrderedDict()
        self._silenced: set[bytes] = set()
        self.refused = 0
        """Frames not handled (busy or dropped), for `status`."""

    def verdict(self, peer: bytes, now_s: float) -> Verdict:
        bucket = self._peers.get(peer)
        if bucket is None:
            bucket = self._peers[peer] = TokenBucket(self.rate_per_s, self.burst, now_s)
            if len(self._peers) > self.max_peers:
                forgotten, _ = self._peers.popitem(last=False)
                self._silenced.discard(forgotten)
        else:
            self._peers.move_to_end(peer)
        if peer in self._silenced:
            if bucket.refill(now_s) < bucket.capacity:
                self.refused += 1
                return Verdict.DROP
            self._silenced.discard(peer)
        if self._total is None:
            self._total = TokenBucket(self.total_rate_per_s, self.total_burst, now_s)
        if bucket.take(now_s) and self._total.take(now_s):
            return Verdict.PASS
        bucket.tokens = 0.0  # refused by its own bucket or the shared one: a full refill before it is heard
        self._silenced.add(peer)
        self.refused += 1
        return Verdict.BUSY
