"""A ZeroMQ socket a test serves from a thread for the length of a `with` block."""

from __future__ import annotations

import abc
import contextlib
import threading
from typing import Iterator

import zmq
from conftest import poll_until

from ringtop.protocol import decode, encode, free_tcp_port, free_tcp_ports
from ringtop.protocol.curve import secure_client


def framed(msg) -> list[bytes]:
    """A message as a rank publishes it: its topic `type.rank`, then its body."""
    return [f"{msg.__struct_config__.tag}.{msg.rank}".encode(), encode(msg)]


@contextlib.contextmanager
def relay_with_ranks(gate, keys, run_id: str, world_size: int = 2) -> Iterator[tuple]:
    """Rank 0's real relay behind `gate` and one PUB per rank with its own key, connected to it:
    (relay, publish address, [PUB of rank 0, ...]). The PUBs never drop (a test's frames must all
    go); closed, and the relay stopped, at the end."""
    from ringtop.agent.transport.relay import Relay

    relay_addr, publish_addr = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(2))
    relay = Relay(relay_addr, publish_addr, run_id=run_id, world_size=world_size, gate=gate)
    gate.start()
    relay.start()
    pubs = []
    try:
        for rank in range(world_size):
            sock = zmq.Context.instance().socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            secure_client(sock, keys.for_rank(rank))
            sock.connect(relay_addr)
            pubs.append(sock)
        yield relay, publish_addr, pubs
    finally:
        for sock in pubs:
            sock.close(0)
        relay.stop()


def subscriber(address: str, keys) -> zmq.Socket:
    """A SUB to everything at `address`, as a UI subscribes (`keys`: the run's client keys, or None)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(sub, keys)
    sub.connect(address)
    return sub


def drain(sock: zmq.Socket, into: list, until) -> None:
    """Receive what `sock` has into `into` until `until(into)` holds (20 s at most)."""
    def got() -> bool:
        while sock.poll(0):
            into.append(decode(sock.recv_multipart()[1]))
        return until(into)

    poll_until(got, 20, "the subscriber's messages", interval_s=0.01)


def subscribed(sub: zmq.Socket, pub: zmq.Socket, first, into: list) -> None:
    """Send `first` from `pub` until `sub` has it (PUB/SUB drops what comes before the
    subscription is up, and a rank's frames wait until its CURVE handshake is done): from then
    on nothing that `pub` sends is lost or held back. Call it once per rank, or one rank's
    whole run may reach the relay before another's first step."""
    def arrived(got: list) -> bool:
        if first not in got:
            pub.send_multipart(framed(first))
            return False
        return True

    drain(sub, into, arrived)


class BackgroundSocket(abc.ABC):
    """Subclasses bind `self.address` in `_run`, set `self.bound`, and serve until `self.stop`."""

    def __init__(self) -> None:
        self.address = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.stop = threading.Event()
        self.bound = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.bound.wait(5)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)

    @abc.abstractmethod
    def _run(self) -> None:
        """Bind, set `self.bound`, serve until `self.stop` is set."""
