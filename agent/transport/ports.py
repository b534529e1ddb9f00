"""Binding rank 0's sockets: a second run on the node never collides with the first.

An address the user gave binds there or fails with a message. A default one that another process
holds moves to a free port on the same host (from `spare_port_range`, where outgoing connections
do not take ports); the address actually bound is what the run writes into its connection file
and Hello, and prints.
"""

from __future__ import annotations

import errno
import sys

import zmq

from ringtop.protocol.endpoints import spare_port_range, with_port

HANDSHAKE_IVL_MS = 1000
"""A connection that has not finished its handshake by then is closed (ZeroMQ's default, 30 s, let
20k idle connections from another user hold 18k of rank 0's file descriptors)."""
BACKLOG = 64
"""Connections the kernel queues for each listening socket before it refuses more."""


class BindError(OSError):
    pass


def limit_peers(sock: zmq.Socket) -> None:
    """What an unauthenticated peer can cost a bound socket: a file descriptor for at most
    HANDSHAKE_IVL_MS; refused handshakes are closed by ZeroMQ at once."""
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
    sock.setsockopt(zmq.BACKLOG, BACKLOG)


def bind(sock: zmq.Socket, address: str, movable: bool, what: str, flag: str) -> str:
    """Bind `sock`; returns the address bound. `what` and `flag` name the socket in messages."""
    limit_peers(sock)
    try:
        sock.bind(address)
        return address
    except zmq.ZMQError as exc:
        if not movable or exc.errno != errno.EADDRINUSE:
            raise BindError(f"cannot bind the {what} socket {address}: {exc}. Is another ringtop run using "
                            f"it? Pick another with {flag}, or leave {flag} out to get a free port.") from exc
    low, high = spare_port_range()
    base = with_port(address, 0).rsplit(":", 1)[0]  # tcp://HOST, IPv6 brackets kept
    try:
        port = sock.bind_to_random_port(base, min_port=low, max_port=high, max_tries=200)
    except zmq.ZMQError as exc:
        raise BindError(f"cannot bind the {what} socket: {address} is taken and no free port was found: {exc}") from exc
    moved = with_port(address, port)
    print(f"ringtop [rank 0]: {address} is taken (another run?); the {what} socket is on {moved} "
          "(written to the run's connection file: `ringtop ls`)", file=sys.stderr, flush=True)
    return moved
