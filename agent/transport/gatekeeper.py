"""Who gets into rank 0's sockets: the run's own keys, nobody else.

One thread answers ZeroMQ's authentication requests (ZAP) for the relay and control sockets of
this context: the relay's input admits the ranks' keys (and names the connection's user id after
the rank, so the relay knows who sent each message) and the node relays' (user id `nodeK`: the
relay lets it carry that node's ranks), the telemetry and control sockets the run's client key
(protocol/curve.py). A node relay has one of its own, admitting its node's rank keys. It also
watches those sockets' handshake failures: a client with no key, a wrong client key or a wrong
server key gets nothing, and is counted. The first refusal is logged at once, later ones summed up
at most once a minute, so a neighbour hammering the port can neither get in nor flood the log.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from ringtop.protocol.curve import (
    CLIENT_DOMAIN,
    HANDSHAKE_FAILURES,
    RELAY_DOMAIN,
    RunKeys,
    ServerKeys,
    failure_reason,
    secure_server,
)
from ringtop.protocol.guard import LoopFaults

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
REPORT_EVERY_S = 60.0

OnRefusal = Callable[[str, int], None]
"""(a line saying what was refused, refusals so far)."""


def node_user(index: int) -> str:
    """The user id of node relay `index`'s connection to rank 0's relay (a rank's is its number)."""
    return f"node{index}"


def rank_users(rank_public: dict[int, str]) -> dict[bytes, bytes]:
    """Rank keys as admitted on a relay input: each connection named after its rank."""
    return {z85.decode(k.encode()): str(rank).encode() for rank, k in rank_public.items()}


class Gatekeeper(threading.Thread):
    def __init__(self, keys: RunKeys | ServerKeys, on_refusal: OnRefusal | None = None,
                 admit: dict[bytes, dict[bytes, bytes]] | None = None, who: str = "rank 0",
                 printed: bool = True) -> None:
        """`admit`: per ZAP domain, the public keys (raw) let in and each one's user id; by default a
        run's (`keys` a RunKeys): the rank and node relay keys on the relay input, the client key on
        telemetry and control. A node relay passes its own server pair and its ranks' keys.
        `printed`: its reports also on stderr (the watcher's go to rank 0, which prints them)."""
        super().__init__(name="ringtop-gatekeeper", daemon=True)
        self.keys = keys
        self.who = who
        self._printed = printed
        """Whose sockets these are, in its log lines (`rank 0`, a node relay's rank)."""
        self.context = zmq.Context()
        """The servers' sockets must live in this context: ZAP is per context."""
        if admit is None:
            relay_users = rank_users(dict(enumerate(keys.rank_public)))
            relay_users.update({z85.decode(k.encode()): node_user(i).encode() for i, k in enumerate(keys.node_public)})
            admit = {RELAY_DOMAIN: relay_users,
                     CLIENT_DOMAIN: {z85.decode(keys.client.client_public.encode()): b"client"}}
        self._users = admit
        """Per ZAP domain: the public keys it admits and the user id each connection gets."""
        self._on_refusal = on_refusal
        self._zap = self.context.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._monitors: dict[zmq.Socket, str] = {}
        self._stop_event = threading.Event()
        self.refused = 0
        self.refused_by_reason: dict[str, int] = {}
        self.faults = LoopFaults("gatekeeper")
        self._last_report = 0.0
        self._unreported = 0

    def secure(self, sock: zmq.Socket, name: str, domain: bytes) -> None:
        """Make a server socket of this context authenticate (`domain`: RELAY_DOMAIN or
        CLIENT_DOMAIN), and count its refusals. Before the socket binds and before this thread
        starts (the monitor is set up on the caller's thread, which owns the socket)."""
        if self.is_alive():
            raise RuntimeError("secure() every socket before the gatekeeper starts")
        if domain not in self._users:
            raise ValueError(f"unknown ZAP domain {domain!r}")
        secure_server(sock, self.keys, domain)
        self._monitors[sock.get_monitor_socket(HANDSHAKE_FAILURES)] = name

    def stop(self, timeout_s: float = 2.0) -> None:
        """After the servers closed their sockets; the context ends in the background (it waits
        for sockets a stuck thread may still hold)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout_s)
        else:
            self._close()
        threading.Thread(target=self.context.term, name="ringtop-gatekeeper-term", daemon=True).start()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        for monitor in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop_event.is_set():
                try:
                    events = dict(poller.poll(50))
                    if self._zap in events:
                        self._answer()
                    for monitor, name in self._monitors.items():
                        if monitor in events:
                            self._read_failures(monitor, name)
                    self._report_due()
                except zmq.ContextTerminated:
                    return
                except Exception as exc:  # never stop answering: a dead handler would lock everyone out
                    self.faults.record(exc)
        finally:
            self._close()

    def _close(self) -> None:
        for sock in (self._zap, *self._monitors):
            sock.close(linger=0)

    def _answer(self) -> None:
        while True:
            try:
                frames = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # ZAP 1.0: version, request id, domain, address, identity, mechanism, credentials...
            request_id = frames[1] if len(frames) > 1 else b""
            user = None
            if len(frames) >= 7 and frames[0] == b"1.0" and frames[5] == b"CURVE":
                user = self._users.get(frames[2], {}).get(frames[6])
            if user is None:
                self._zap.send_multipart([b"1.0", request_id, b"400", b"not a key of this run", b"", b""])
            else:
                self._zap.send_multipart([b"1.0", request_id, b"200", b"OK", user, b""])

    def _read_failures(self, monitor: zmq.Socket, name: str) -> None:
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self.refused += 1
            reason = failure_reason(event["event"], event["value"])
            self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + 1
            self._unreported += 1
            if self.refused == 1:
                self._report(f"refused a connection to the {name} socket ({reason}); only holders of this "
                             "run's connection file get in")

    def _report_due(self) -> None:
        if self._unreported and time.monotonic() - self._last_report >= REPORT_EVERY_S:
            reasons = ", ".join(f"{n} {r}" for r, n in sorted(self.refused_by_reason.items()))
            self._report(f"refused {self._unreported} more connections in the last minute "
                         f"({self.refused} in all: {reasons})")

    def _report(self, text: str) -> None:
        self._last_report, self._unreported = time.monotonic(), 0
        if self._printed:
            print(f"ringtop [{self.who}]: {text}", file=sys.stderr, flush=True)
        if self._on_refusal is not None:
            try:
                self._on_refusal(text, self.refused)
            except Exception as exc:
                self.faults.record(exc)
