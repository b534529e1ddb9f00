"""A ZeroMQ socket a test serves from a thread for the length of a `with` block."""

from __future__ import annotations

import threading

from ringtop.protocol import free_tcp_port


class BackgroundSocket:
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

    def _run(self) -> None:
        raise NotImplementedError
