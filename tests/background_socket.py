"""A ZeroMQ socket a test serves from a thread for the length of a `with` block."""

from __future__ import annotations

import abc
import threading

import zmq

from ringtop.protocol import free_tcp_port
from ringtop.protocol.curve import secure_client


def subscriber(address: str, keys) -> zmq.Socket:
    """A SUB to everything at `address`, as a UI subscribes (`keys`: the run's client keys, or None)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(sub, keys)
    sub.connect(address)
    return sub


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
