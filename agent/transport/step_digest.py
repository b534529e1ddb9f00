"""The head relay's conflated steps (protocol: `digest`), for the UIs of a large run.

Why: a UI folds every message it receives on its one thread, so at 1024 ranks x 10 Hz it spent its
time taking in steps it could never show (it repaints 4 times a second). A UI that subscribes to
`digest.` instead of `step.` gets, every `interval_s`, each rank's latest Step whole and a brief of
the older ones (what the histories, the cross-rank chart and goodput need of every step): a few
messages a second, whatever the step rate, and O(ranks x digest rate) folds instead of
O(ranks x step rate). Nothing is built while no UI asks for digests.

The relay already decoded and checked every message it forwards; this only keeps references and
cuts them into digests of at most MAX_DIGEST_STEPS steps, MAX_DIGEST_BRIEFS briefs and about
DIGEST_BODY_BYTES of step bodies (every message must fit in MAX_FRAME_BYTES).
"""

from __future__ import annotations

from collections import deque

from ringtop.protocol import UI_RANK, Digest, Step, StepBrief
from ringtop.protocol.messages import MAX_DIGEST_BRIEFS, MAX_DIGEST_STEPS

DIGEST_INTERVAL_S = 0.2
"""The UI refreshes its screen as each digest comes in; a digest's newest step is at most one
interval old when it goes out, so the screen is at most about two intervals behind the ranks
(the issue's target: 0.5 s). More often would fold more steps whole for nothing: the UI repaints
about 4 times a second."""
DIGEST_BODY_BYTES = 640 << 10
"""Step bodies per digest, leaving room for the briefs (~45 bytes each) under MAX_FRAME_BYTES."""
BRIEF_BYTES = 48
MAX_BRIEFS_PER_RANK = 64
"""Older steps of one rank kept between two digests (a rank at 256 Hz); beyond, the oldest go."""


def brief(step: Step) -> StepBrief:
    return StepBrief(step.rank, step.step, step.ts, step.step_ms, step.loss, step.grad_norm, step.skipped)


class StepDigest:
    """Fed each Step the relay forwards (`add`), on the relay's thread; `take` cuts the digests."""

    def __init__(self, interval_s: float = DIGEST_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._latest: dict[int, tuple[Step, int]] = {}
        """rank -> its newest Step since the last digest, and its body's size."""
        self._older: dict[int, deque[StepBrief]] = {}
        self._dropped = 0
        self.seq = 0

    def add(self, step: Step, body_bytes: int) -> None:
        latest = self._latest
        prev = latest.get(step.rank)
        if prev is not None:
            older = self._older.get(step.rank)
            if older is None:
                older = self._older[step.rank] = deque(maxlen=MAX_BRIEFS_PER_RANK)
            elif len(older) == MAX_BRIEFS_PER_RANK:
                self._dropped += 1
            older.append(brief(prev[0]))
        latest[step.rank] = (step, body_bytes)

    def clear(self) -> None:
        """No UI wants digests any more: keep nothing."""
        self._latest.clear()
        self._older.clear()
        self._dropped = 0

    def take(self, ts: float, relay_gaps: int, relay_skipped: int = 0) -> list[Digest]:
        """The digests of everything added since the last take (none if nothing was), ranks in
        order; each rank's briefs travel in the digest that carries its latest step."""
        if not self._latest:
            return []
        digests: list[Digest] = []
        steps: list[Step] = []
        briefs: list[StepBrief] = []
        body_bytes = 0
        dropped, self._dropped = self._dropped, 0
        latest, older = self._latest, self._older
        for rank in sorted(latest):
            step, size = latest[rank]
            mine = older.get(rank, ())
            if (steps or briefs) and (len(steps) >= MAX_DIGEST_STEPS or len(briefs) + len(mine) > MAX_DIGEST_BRIEFS
                          or body_bytes + size + BRIEF_BYTES * len(mine) > DIGEST_BODY_BYTES):
                digests.append(self._digest(ts, steps, briefs, dropped, relay_gaps, relay_skipped))
                steps, briefs, body_bytes, dropped = [], [], 0, 0
            briefs.extend(mine)
            if size > DIGEST_BODY_BYTES:
                briefs.append(brief(step))  # too big to carry whole (a hostile rank's): its numbers only
                size = 0
            else:
                steps.append(step)
            body_bytes += size + BRIEF_BYTES * len(mine)
        digests.append(self._digest(ts, steps, briefs, dropped, relay_gaps, relay_skipped))
        latest.clear()
        older.clear()
        return digests

    def _digest(self, ts: float, steps: list[Step], briefs: list[StepBrief], dropped: int,
                relay_gaps: int, relay_skipped: int) -> Digest:
        self.seq += 1
        return Digest(rank=UI_RANK, seq=self.seq, ts=ts, interval_s=self.interval_s, steps=steps,
                      briefs=briefs, briefs_dropped=dropped, relay_gaps=relay_gaps,
                      relay_skipped=relay_skipped)
