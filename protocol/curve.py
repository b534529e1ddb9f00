"""The run's keys and how a socket is made to use them (ZeroMQ CURVE).

Rank 0 makes, per run, a key pair for its servers (relay input, telemetry, control), one for the
run's clients (UIs and `ringtop ctl`: it is what the connection file holds), one per rank (its
publisher into the relay) and, on several nodes, one per node relay (it forwards its node's ranks
to rank 0's relay, which lets that key carry those ranks and no other). Each server socket admits
only its own clients' keys (`agent/transport/gatekeeper.py`): the relay input only the ranks' (and node
relays') keys, so a holder of the connection file can read and command the run but cannot publish
as a rank, and the relay knows which rank sent each message. The secrets never leave the job: the
server's stays in rank 0's memory, each rank gets its own from rank 0 over the job's process group,
and the client key pair is in the connection file, readable by its owner alone.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import zmq

Z85_KEY = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")]
"""A 32-byte Curve25519 key in Z85 text: 40 characters."""
RELAY_DOMAIN = b"ringtop.relay"
"""The ZAP domain of the relay's input: rank keys only."""
CLIENT_DOMAIN = b"ringtop.client"
"""The ZAP domain of the telemetry and control sockets: the client key only."""


class ClientKeys(msgspec.Struct, frozen=True, kw_only=True):
    """What a client needs: the server's public key and its own key pair."""

    server_public: Z85_KEY
    client_public: Z85_KEY
    client_secret: Z85_KEY


class ServerKeys(msgspec.Struct, frozen=True, kw_only=True):
    """A server's own pair: a node relay makes one for itself (its secret never leaves its process)."""

    server_public: Z85_KEY
    server_secret: Z85_KEY


class RunKeys(msgspec.Struct, frozen=True, kw_only=True):
    """Every key of a run; rank 0 alone holds this."""

    server_public: Z85_KEY
    server_secret: Z85_KEY
    client: ClientKeys
    rank_public: list[Z85_KEY]
    rank_secret: list[Z85_KEY]
    node_public: list[Z85_KEY] = []
    """One per node relay (every node but the head's): the key it forwards its ranks' messages with."""
    node_secret: list[Z85_KEY] = []

    def for_rank(self, rank: int) -> ClientKeys:
        return ClientKeys(server_public=self.server_public, client_public=self.rank_public[rank],
                          client_secret=self.rank_secret[rank])

    def for_node(self, index: int) -> ClientKeys:
        return ClientKeys(server_public=self.server_public, client_public=self.node_public[index],
                          client_secret=self.node_secret[index])


def available() -> bool:
    return bool(zmq.has("curve"))


def _pair() -> tuple[str, str]:
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


def generate(world_size: int = 1, node_relays: int = 0) -> RunKeys:
    if not available():
        raise RuntimeError("this libzmq has no CURVE support; reinstall pyzmq (its wheels bundle it) or "
                           "pass --insecure on a trusted machine")
    server_public, server_secret = _pair()
    client_public, client_secret = _pair()
    ranks = [_pair() for _ in range(world_size)]
    nodes = [_pair() for _ in range(node_relays)]
    return RunKeys(server_public=server_public, server_secret=server_secret,
                   client=ClientKeys(server_public=server_public, client_public=client_public,
                                     client_secret=client_secret),
                   rank_public=[p for p, _ in ranks], rank_secret=[s for _, s in ranks],
                   node_public=[p for p, _ in nodes], node_secret=[s for _, s in nodes])


def server_pair() -> ServerKeys:
    public, secret = _pair()
    return ServerKeys(server_public=public, server_secret=secret)


def secure_server(sock: zmq.Socket, keys: RunKeys | ServerKeys, domain: bytes) -> None:
    """Before bind: CURVE server, and every handshake goes to the ZAP handler with `domain` (a
    missing handler refuses, it does not admit)."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret.encode())
    sock.setsockopt(zmq.ZAP_DOMAIN, domain)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def secure_client(sock: zmq.Socket, keys: ClientKeys | None) -> None:
    """Before connect. None: a plain socket, for a run started with --insecure."""
    if keys is None:
        return
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret.encode())


HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def failure_reason(event: int, value: int) -> str:
    """A server's handshake failure event, in the words a user needs."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "wrong client key"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "no keys (an unauthenticated client)"
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return "wrong server key"
        return "not the ZeroMQ protocol"
    return "handshake failed"


def client_failure_reason(event: int, value: int, has_keys: bool) -> str:
    """A client's handshake failure event: what the user should do about it."""
    if not has_keys:
        return ("the run requires its keys: pass --keys FILE (its connection file: `ringtop connect-info` on "
                "its node), or find it by run id on the node")
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "the run refused this client's key (a connection file of another run?)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "the run has no authentication (started with --insecure): connect with --insecure"
    return ("the run's key does not match (an old connection file, another run on this port, or a run "
            "started with --insecure: `ringtop ls` marks those)")


def close_monitored(sock: zmq.Socket, linger: int | None = None) -> None:
    """Close a socket whose handshakes a monitor may watch (a server under the gatekeeper), on its
    own thread: libzmq frees a socket only once its monitor is turned off."""
    sock.disable_monitor()
    sock.close(linger)


class HandshakeWatch:
    """A client socket's handshake failures, read without blocking (for a clear error instead of
    silence when a run refuses our keys)."""

    def __init__(self, sock: zmq.Socket, has_keys: bool) -> None:
        self._sock = sock
        self._monitor = sock.get_monitor_socket(HANDSHAKE_FAILURES | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._has_keys = has_keys
        self.failure = ""

    def read(self) -> str:
        """The latest failure's reason since the last success ("" if none)."""
        from zmq.utils.monitor import parse_monitor_message

        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except (zmq.ZMQError, ValueError, KeyError):  # zmq.Again: nothing new
                return self.failure
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.failure = ""
            else:
                self.failure = client_failure_reason(event["event"], event["value"], self._has_keys)

    def close(self) -> None:
        """Before the socket closes, on its thread: libzmq frees a socket only once its monitor is
        turned off, and a monitor's endpoint is named after the file descriptor the next socket
        reuses (a client's second command failed with "Address already in use")."""
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
