"""The simulated ranks' sockets: one XPUB each, connected with that rank's own CURVE key pair
(the relay drops a message whose rank is not its sender's), and what they sent and dropped."""

from __future__ import annotations

import resource
import sys
import threading
import time
from typing import Any, Callable

import zmq

from ringtop.protocol import curve, encode

SUBSCRIBE_WAIT_S = 60.0
CONNECT_BATCH = 256
"""Ranks connected at once: 4096 CURVE handshakes at once on a loaded machine timed some out
(the gatekeeper counted ~100 refusals, which the UI then shows as an attack)."""
TOPICS = ("hello", "step", "sample", "heartbeat", "event", "stall", "bye", "reply")

Where = Callable[[int], tuple[str, curve.ClientKeys]]
"""A rank -> the address it publishes to and its keys (its own pair)."""


class RankSockets:
    """Sends stamp each message with its rank, its next `seq` and the time, never blocking: a full
    socket refuses the send, counted in the rank's `drops` as a real rank counts them."""

    def __init__(self, world_size: int, stop: threading.Event) -> None:
        self.stop = stop
        self.socks: dict[int, zmq.Socket] = {}
        self.sent = 0
        self.send_drops = 0
        self.drops = [0] * world_size
        self._seq = [0] * world_size
        self._topics = [{t: f"{t}.{r}".encode() for t in TOPICS} for r in range(world_size)]

    def send(self, rank: int, msg: Any) -> None:
        msg.rank, msg.seq, msg.ts = rank, self._seq[rank], time.time()
        self._seq[rank] += 1
        try:
            self.socks[rank].send_multipart([self._topics[rank][msg.__struct_config__.tag], encode(msg)], zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.drops[rank] += 1
            self.send_drops += 1

    def send_all(self, make: Callable[[int], Any]) -> None:
        for rank in self.socks:
            self.send(rank, make(rank))

    def connect_all(self, ctx: zmq.Context, ranks: list[int], where: Where) -> None:
        """Into `socks` as they open (`close` closes them, also when this fails)."""
        for first in range(0, len(ranks), CONNECT_BATCH):  # a few hundred handshakes at a time
            if self.stop.is_set():
                break
            part = ranks[first:first + CONNECT_BATCH]
            batch = _connect(ctx, part, where)
            self.socks.update(zip(part, batch))
            self._await_subscriptions(batch)

    def _await_subscriptions(self, socks: list[zmq.Socket]) -> None:
        """An XPUB drops what it sends before the relay's subscription arrives (telemetry.py)."""
        waiting = set(range(len(socks)))
        deadline = time.monotonic() + SUBSCRIBE_WAIT_S
        while waiting and time.monotonic() < deadline and not self.stop.is_set():
            for rank in list(waiting):
                try:
                    while True:
                        if socks[rank].recv(zmq.NOBLOCK)[:1] == b"\x01":
                            waiting.discard(rank)
                            break
                except zmq.Again:
                    pass
            if waiting:
                time.sleep(0.01)
        if waiting and not self.stop.is_set():
            print(f"ringtop simulate: {len(waiting)} ranks never got the relay's subscription", file=sys.stderr)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(0)


def _connect(ctx: zmq.Context, ranks: list[int], where: Where) -> list[zmq.Socket]:
    socks = []
    for rank in ranks:
        address, keys = where(rank)
        sock = ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.SNDHWM, 64)
        sock.setsockopt(zmq.SNDBUF, 64 << 10)
        sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue refuses the send: counted in the rank's drops
        sock.setsockopt(zmq.LINGER, 0)
        curve.secure_client(sock, keys)
        sock.connect(address)
        socks.append(sock)
    return socks


def raise_fd_limit(wanted: int) -> None:
    """Each rank's socket holds a TCP connection at both ends and a signalling descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
