"""Binding rank 0's sockets: a second run on the node never collides with the first.

An address the user gave binds there or fails with a message. A default one that another process
holds moves to a free port on the same host (chosen below the kernel's ephemeral range, where
outgoing connections do not take ports); the address actually bound is what the run writes into
its connection file and Hello, and prints.
"""

from __future__ import annotations

import errno
import sys

import zmq

from ringtop.protocol.endpoints import ephemeral_range, parse_tcp


class BindError(OSError):
    pass


def bind(sock: zmq.Socket, address: str, movable: bool, what: str, flag: str) -> str:
    """Bind `sock`; returns the address bound. `what` and `flag` name the socket in messages."""
    try:
        sock.bind(address)
        return address
    except zmq.ZMQError as exc:
        if not movable or exc.errno != errno.EADDRINUSE:
            raise BindError(f"cannot bind the {what} socket {address}: {exc}. Is another ringtop run using "
                            f"it? Pick another with {flag}, or leave {flag} out to get a free port.") from exc
    host, _ = parse_tcp(address)
    low, _ = ephemeral_range()
    base = f"tcp://[{host}]" if ":" in host else f"tcp://{host}"
    try:
        port = sock.bind_to_random_port(base, min_port=max(1024, low - 12000), max_port=low, max_tries=200)
    except zmq.ZMQError as exc:
        raise BindError(f"cannot bind the {what} socket: {address} is taken and no free port was found: {exc}") from exc
    moved = f"{base}:{port}"
    print(f"ringtop [rank 0]: {address} is taken (another run?); the {what} socket is on {moved} "
          "(written to the run's connection file: `ringtop ls`)", file=sys.stderr, flush=True)
    return moved
