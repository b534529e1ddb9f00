"""Rank 0's relay: every rank publishes into its XSUB, every UI subscribes to its XPUB.

A plain `zmq.proxy` would do the forwarding, but a UI that attaches mid-run would then never see
the ranks' Hello messages. The relay keeps the latest Hello, Bye and pipeline Timeline of each rank
and re-sends them whenever a new subscription arrives, so any UI can attach (or re-attach) at any
time and draw at once.
"""

from __future__ import annotations

import threading

import zmq

CACHED_TOPICS = (b"hello.", b"bye.", b"timeline.")


class Relay(threading.Thread):
    def __init__(self, relay_address: str, publish_address: str, context: zmq.Context | None = None):
        super().__init__(name="ringtop-relay", daemon=True)
        ctx = context or zmq.Context.instance()
        self._backend = ctx.socket(zmq.XSUB)
        self._frontend = ctx.socket(zmq.XPUB)
        self._frontend.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._frontend.setsockopt(zmq.SNDHWM, 10_000)
        for sock in (self._backend, self._frontend):
            sock.setsockopt(zmq.LINGER, 500)
        try:
            self._backend.bind(relay_address)
            self._frontend.bind(publish_address)
        except zmq.ZMQError as exc:
            self._backend.close(0)
            self._frontend.close(0)
            raise OSError(f"cannot bind the telemetry relay ({relay_address}, {publish_address}): {exc}. "
                          "Is another ringtop run using these ports? Pick others with --publish/--relay.") from exc
        self._backend.send(b"\x01")
        self._cache: dict[bytes, list[bytes]] = {}
        self._stop_event = threading.Event()
        self.forwarded = 0

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop_event.set()
        self.join(timeout_s)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._backend, zmq.POLLIN)
        poller.register(self._frontend, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(50))
                if self._backend in events:
                    self._forward_all()
                if self._frontend in events:
                    self._handle_subscriptions()
                if self._stop_event.is_set() and not events:
                    return
        finally:
            self._backend.close()
            self._frontend.close()

    def _forward_all(self) -> None:
        while True:
            try:
                frames = self._backend.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames and frames[0].startswith(CACHED_TOPICS):
                self._cache[frames[0]] = frames
            self._frontend.send_multipart(frames)
            self.forwarded += 1

    def _handle_subscriptions(self) -> None:
        new_subscriber = False
        while True:
            try:
                frame = self._frontend.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            new_subscriber |= frame[:1] == b"\x01"
        if new_subscriber:
            for frames in sorted(self._cache.values(), key=lambda f: not f[0].startswith(b"hello.")):
                self._frontend.send_multipart(frames)
