"""Where the app's messages come from: a live run (a receive thread posts decoded batches) or a
recorded one (folded in by chunks, so the UI stays responsive while a large log loads). Either way
each message goes to the view model only; nothing here repaints."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from textual.message import Message

from ringtop.protocol import UI_RANK, Digest
from ringtop.tui.sources.connection import TelemetryClient

DIGEST_REFRESH_GAP_S = 0.15
"""With digests the screen is refreshed as a digest is folded in, but not sooner than this after
the last refresh (a large run's digests of one interval may come in two batches)."""
TIMER_REFRESH_AFTER_S = 0.3
"""With digests the app's timer (REFRESH_S) refreshes only when no refresh came for this long (no
digest: a run that stopped stepping still sees its stale and hang indicators move on)."""

REPLAY_CHUNK = 5_000


def newest_rank_ts(messages: list[Any]) -> float:
    """The newest `ts` a rank stamped among `messages` (0: none): its steps inside the relay's
    digests count, the relay's own stamps do not (a digest sent now may hold steps that waited
    seconds in the relay's queue: the screen is as old as those)."""
    newest = 0.0
    for m in messages:
        if type(m) is Digest:
            for s in m.steps:
                newest = max(newest, s.ts)
            for b in m.briefs:
                newest = max(newest, b.ts)
        elif getattr(m, "rank", UI_RANK) >= 0:
            newest = max(newest, getattr(m, "ts", 0.0))
    return newest


class TelemetryBatch(Message):
    """Decoded messages (and rejected-frame errors) from the receive thread."""

    def __init__(self, messages: list[Any], rejected: list[str]) -> None:
        super().__init__()
        self.messages = messages
        self.rejected = rejected


class Feeds:
    """Mixed into the App (`self` is the RingtopApp)."""

    def _start_client(self) -> None:
        assert self.publish_addr is not None
        client = TelemetryClient(self.publish_addr, self.control_addr, self._on_batch_from_thread, keys=self.keys,
                                 folds_later=True)
        try:
            client.start()
        except Exception as exc:  # a bad address: say so, keep the UI up
            self.view.note(f"cannot connect to {self.publish_addr}: {exc}", level="error", kind="connect")
            return
        self.client = client
        self.view.note(f"subscribed to {self.publish_addr}, control {self.control_addr or 'none'}", kind="connect")

    def _on_batch_from_thread(self, messages: list[Any], rejected: list[str]) -> None:
        self.post_message(TelemetryBatch(messages, rejected))  # thread-safe (call_soon_threadsafe)

    async def _load_replay(self) -> None:
        msgs = self._replay_messages
        for i in range(0, len(msgs), REPLAY_CHUNK):
            self.view.apply_batch(msgs[i : i + REPLAY_CHUNK], time.monotonic(), self._not_shown)
            self.replay_applied = min(len(msgs), i + REPLAY_CHUNK)
            await asyncio.sleep(0)
        self.replay_applied = len(msgs)
        self.replay_loaded = True
        self.view.note(f"replay loaded: {len(msgs):,} messages from {self.source or 'log'}", kind="replay")
        self.refresh_view()

    def _stop_client(self, timeout_s: float = 2.0) -> None:
        if self.client is not None:
            self.client.stop(timeout_s)
            self.client = None

    def _follow_run(self, now: float) -> None:
        """The run restarted (its new attempt's watcher wrote the connection file): attach to it; the view goes on."""
        if self.follower is None:
            return
        if self.client is not None and self.view.is_ended:
            # its relay ended with its attempt: left open, the sockets would reconnect to the next
            # attempt's relay on the same port with this attempt's keys, and be refused (an alarm in its events)
            self._stop_client(timeout_s=0.0)
        moved = self.follower.moved(now)
        if moved is None:
            return
        self._stop_client(timeout_s=0.0)  # its thread closes its sockets as it ends; the UI does not wait
        self.publish_addr, self.control_addr, self.keys = moved.publish, moved.control, moved.keys
        self.view.note(f"the run started again (its relay's process {moved.pid}): attaching to it", kind="connect")
        self._start_client()

    def on_telemetry_batch(self, batch: TelemetryBatch) -> None:
        now = time.monotonic()
        digests = self.view.digests_folded
        client = self.client
        try:
            self.view.apply_batch(batch.messages, now, self._not_shown)
        finally:
            if client is not None:  # the next batch may come (connection.py: newest wins while it waits)
                client.ack()
                self.view.receiver_skipped = client.skipped
        newest = newest_rank_ts(batch.messages)
        if newest > 0:
            self.view.lag.observe(time.time() - newest, now)
        for err in batch.rejected:
            self.view.note_rejected(err, now)
        if self.view.digests_folded != digests and now - self.refreshed_at >= DIGEST_REFRESH_GAP_S:
            self.refresh_view()  # the relay's newest steps on screen now, not at the next tick
        if client is not None:
            want = self.view.wants_digests
            if want and not self.view.via_digests:
                self.view.via_digests = True
                self.view.note(f"{self.view.facts.world_size:,} ranks: steps now come in the relay's digests "
                               "(each rank's latest a few times a second, the older ones by their numbers)",
                               kind="connect")
            if want is not client.wanted_digests:
                client.want_digests(want)

    def _not_shown(self, msg: Any, exc: Exception) -> None:
        """A view bug must not take the UI down: the message is left out, and said so."""
        self.view.note(f"could not show a {type(msg).__name__} message: {exc!r}", level="error", kind="ui")

    def _replay_pct(self) -> float:
        n = len(self._replay_messages)
        return 100.0 * self.replay_applied / n if n else 100.0
