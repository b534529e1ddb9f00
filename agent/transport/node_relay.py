"""A node relay: on every node but rank 0's, the node's ranks publish to it over loopback and it
forwards them to rank 0's relay (the head) through one authenticated connection.

Why: one connection per node crosses the network instead of one per rank, and the ranks' own
sockets never leave loopback. It runs in the node's watcher process (agent/watcher/, started
by the node's lowest rank; under --no-watcher a thread of that rank) and never blocks training:
it only moves frames between non-blocking sockets.

- Its input is an XSUB bound on 127.0.0.1, a CURVE server with a key pair of its own (made here;
  the secret never leaves this process) admitting the run's rank keys, each connection named after
  its rank; a message must be its sender's and of a rank of this node, as rank 0's relay checks.
- Upstream it is an XPUB connected to the head with this node's key, which the head lets carry
  exactly this node's ranks; what is queued goes in batches (protocol/batch.py), the head's cost
  being per ZeroMQ message. The head's subscription says it is there; its loss (the connection
  dropped, or ZeroMQ's heartbeats unanswered for a few seconds) is an unsubscription.
- While the head is away, messages wait in a bounded queue (the oldest dropped and counted as
  lost when it is full), and are sent when it is back, after those sent in the seconds before the
  loss was noticed (ZeroMQ accepted them, the connection may not have delivered them: the head
  drops the ones it has by their `seq`); a `relay` event says when the head was lost
  and when forwarding resumed, with how many messages were lost on the way.
- What the head sends down (`protocol/downlink.py`: `ctl stacks`, `stop`, `dump`) goes on down to
  this node's ranks.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable, Collection

import zmq

from ringtop.agent.transport.gatekeeper import Gatekeeper, rank_users
from ringtop.agent.transport.ports import limit_peers
from ringtop.agent.transport.relay_checks import CONFLATED_TOPICS, real_message, skip_report
from ringtop.protocol import MAX_FRAME_BYTES, Message, curve, encode
from ringtop.protocol.batch import BATCH_MESSAGES, encode_batch
from ringtop.protocol.curve import RELAY_DOMAIN, ClientKeys, close_monitored, secure_client
from ringtop.protocol.downlink import MAX_DOWNLINK_BYTES, PREFIX
from ringtop.protocol.endpoints import spare_port_range
from ringtop.protocol.guard import LoopFaults

QUEUE_CAPACITY = 8192
"""Messages kept while the head is away (a few seconds of a node's telemetry)."""
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 4000
"""A head that answers no ZeroMQ heartbeat for this long is lost (a silent network, not only a reset)."""
REPLAY_S = HEARTBEAT_TIMEOUT_MS / 1000 + 2.0
"""Messages sent this long before the loss was noticed are sent again when the head is back."""

@dataclass(frozen=True)
class NodeLayout:
    """Which ranks share a node: `nodes[0]` is the head's (it holds rank 0), the others in order
    of their lowest rank; each sorted. The first rank of a node (its local rank 0) runs its relay."""

    nodes: tuple[tuple[int, ...], ...]

    @classmethod
    def from_hosts(cls, hosts: list[int]) -> NodeLayout:
        """`hosts`: every rank's host id (agent/health/peers.py); ranks of one host name are one node."""
        by_host: dict[int, list[int]] = {}
        for rank, host in enumerate(hosts):
            by_host.setdefault(host, []).append(rank)
        return cls(tuple(tuple(ranks) for ranks in sorted(by_host.values())))

    @property
    def multi(self) -> bool:
        return len(self.nodes) > 1

    def node_of(self, rank: int) -> int:
        return next(i for i, ranks in enumerate(self.nodes) if rank in ranks)

    def leads(self, rank: int) -> bool:
        """Whether `rank` runs its node's relay (never on the head's node: rank 0's relay is there)."""
        node = self.node_of(rank)
        return node > 0 and self.nodes[node][0] == rank

    def carriers(self, user: Callable[[int], str]) -> dict[str, tuple[int, ...]]:
        """Node relay k's user id (`user(k)`) -> the ranks its key may carry: node k + 1's."""
        return {user(k): ranks for k, ranks in enumerate(self.nodes[1:])}


OnEvent = Callable[[str, str, dict], None]
"""(level, text, data) of a `relay` event, emitted by the caller as this process's rank."""


class NodeRelay(threading.Thread):
    def __init__(self, upstream: str, upstream_keys: ClientKeys | None, ranks: Collection[int],
                 rank_public: dict[int, str] | None, run_id: str | None, world_size: int | None,
                 capacity: int = QUEUE_CAPACITY, on_event: OnEvent | None = None, host: str = "127.0.0.1",
                 address: str | None = None, server: curve.ServerKeys | None = None,
                 observers: Collection[Callable[[Message], None]] = ()):
        """`upstream`: the head relay's address; `upstream_keys`: this node's key pair and the head's
        public key (None: --insecure, plain sockets); `ranks`: this node's; `rank_public`: their
        public keys (what the input admits). `address`, `server`: a predecessor's, to take its
        place (its ranks reconnect by themselves); by default a free port and a new key pair.
        `observers`: called on its thread with each real message of its ranks (the node's
        watcher learns its ranks' processes and last steps so).
        Long by design: both sockets, the queue and every counter, each with its docstring, set
        here before the thread starts and owns them."""
        super().__init__(name="ringtop-node-relay", daemon=True)
        self._args = (upstream, upstream_keys, ranks, rank_public, run_id, world_size, capacity, host)
        self.upstream = upstream
        self.ranks = frozenset(ranks)
        self.run_id, self.world_size = run_id, world_size
        self.on_event = on_event
        self.observers = list(observers)
        self._own: collections.deque[list[bytes]] = collections.deque(maxlen=256)
        """The node watcher's own messages (a RankExit of one of its ranks), queued from any thread."""
        self.forwarded = 0
        self.dropped = 0
        """Frames that were not real (a forged or malformed one, or a rank of another node)."""
        self.lost = 0
        """Real messages that never reached the head: the queue was full while it was away."""
        self.downlinked = 0
        self.faults = LoopFaults("node relay")
        self.server: curve.ServerKeys | None = None
        self.gate: Gatekeeper | None = None
        if upstream_keys is not None:
            self.server = server or curve.server_pair()
            self.gate = Gatekeeper(self.server, admit={RELAY_DOMAIN: rank_users(dict(rank_public or {}))},
                                   who=f"node relay of ranks {_ranks(self.ranks)}")
        ctx = self.gate.context if self.gate is not None else zmq.Context.instance()
        self._local = ctx.socket(zmq.XSUB)
        self._local.setsockopt(zmq.LINGER, 500)
        if self.gate is not None:
            self.gate.secure(self._local, "node relay input", RELAY_DOMAIN)
        limit_peers(self._local)
        try:
            if address is not None:
                self._local.bind(address)
                self.address = address
            else:
                low, high = spare_port_range()
                port = self._local.bind_to_random_port(f"tcp://{host}", min_port=low, max_port=high, max_tries=200)
                self.address = f"tcp://{host}:{port}"
        except zmq.ZMQError:
            close_monitored(self._local, 0)
            if self.gate is not None:
                self.gate.stop()
            raise
        self._local.send(b"\x01")
        self._up = ctx.socket(zmq.XPUB)
        self._up.setsockopt(zmq.XPUB_NODROP, 1)  # a full pipe says so (zmq.Again) instead of dropping unseen
        self._up.setsockopt(zmq.IMMEDIATE, 1)  # a lost connection ends its pipe: the head's unsubscription says so
        self._up.setsockopt(zmq.SNDHWM, max(1, capacity // BATCH_MESSAGES))  # batches: about `capacity` messages
        self._up.setsockopt(zmq.LINGER, 2000)
        self._up.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self._up.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._up.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
        self._up.setsockopt(zmq.RECONNECT_IVL, 200)
        self._up.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        secure_client(self._up, upstream_keys)
        self._up.connect(upstream)
        self._queue: collections.deque[list[bytes]] = collections.deque(maxlen=capacity)
        self._queued: dict[bytes, list[bytes]] = {}
        """Conflatable topic -> its latest message while it waits in the queue: while the head is
        slow or away, a newer one of the rank replaces it (emptied in place, skipped when sent)."""
        self.skipped = 0
        """Readings replaced so, each by a newer one of the same rank (the rank's log keeps them)."""
        self._skips: dict[int, int] = {}
        """Rank -> skipped since the head was last told (so it does not count them as lost)."""
        self._sent: collections.deque[tuple[float, list[bytes]]] = collections.deque(maxlen=capacity)
        """The latest messages sent, with when: the ones a lost connection may have swallowed."""
        self.replayed = 0
        self.head_up = False
        self._ever_up = False
        self._lost_at = 0.0
        self._lost_then = 0
        self._stop_event = threading.Event()
        self._killed = threading.Event()

    def successor(self) -> NodeRelay | None:
        """A node relay in this one's place (same address and keys), once this one has ended: the
        node's ranks reconnect to it by themselves, and what they sent meanwhile waits in their
        sockets. None while the old port is not yet free."""
        upstream, keys, ranks, rank_public, run_id, world_size, capacity, host = self._args
        try:
            return NodeRelay(upstream, keys, ranks, rank_public, run_id, world_size, capacity, self.on_event, host,
                             address=self.address, server=self.server, observers=self.observers)
        except zmq.ZMQError:
            return None

    @property
    def ranks_text(self) -> str:
        return _ranks(self.ranks)

    @property
    def stopping(self) -> bool:
        """Asked to stop (the run ends): not to be started again."""
        return self._stop_event.is_set()

    def publish_own(self, msg: Message) -> None:
        """Thread-safe: `msg` (the node watcher's RankExit, UI_RANK's) to the head with its ranks'
        messages; the head takes it only for a rank this relay carries."""
        self._own.append([f"{msg.__struct_config__.tag}.{msg.rank}".encode(), encode(msg)])

    def kill(self) -> None:
        """End at once, dropping what it holds, as if it had died (--inject-node-relay-death)."""
        self._killed.set()

    @property
    def server_public(self) -> str:
        return self.server.server_public if self.server is not None else ""

    def client_keys(self, public: str, secret: str) -> ClientKeys | None:
        """What a rank of this node connects with: its own pair and this relay's public key."""
        if self.server is None:
            return None
        return ClientKeys(server_public=self.server.server_public, client_public=public, client_secret=secret)

    def start(self) -> None:
        if self.gate is not None:
            self.gate.start()
        super().start()

    def stop(self, timeout_s: float = 3.0) -> None:
        """Once this node's ranks have sent their last messages: forwards what is queued (if the
        head is there), then closes."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout_s)
        if self.gate is not None:
            self.gate.stop()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._local, zmq.POLLIN)
        poller.register(self._up, zmq.POLLIN)
        try:
            while True:
                events: dict = {}
                if self._killed.is_set():
                    return
                try:
                    events = dict(poller.poll(50))
                    if self._up in events:
                        self._read_upstream()
                    if self._local in events:
                        self._take_local()
                    while self._own:
                        self._queue.append(self._own.popleft())
                    if self.head_up and self._queue:
                        self._flush()
                except zmq.ContextTerminated:
                    return
                except Exception as exc:  # never let the relay die
                    self.faults.record(exc)
                if self._stop_event.is_set() and not events and not (self.head_up and self._queue):
                    self.lost += sum(1 for f in self._queue if f)
                    return
        finally:
            linger = 0 if self._killed.is_set() else None
            close_monitored(self._local, linger)
            self._up.close(linger)

    def _take_local(self) -> None:
        for _ in range(1024):  # bounded: the head's frames (and its loss) are read in between
            try:
                parts = self._local.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = [p.bytes for p in parts]
            msg = real_message(frames, self._sender(parts[-1]), self.run_id, self.world_size)
            if msg is None:
                self.dropped += 1
                continue
            for observe in self.observers:
                try:
                    observe(msg)
                except Exception as exc:  # an observer's bug must not stop the forwarding
                    self.faults.record(exc)
            queue = self._queue
            if len(queue) > BATCH_MESSAGES and frames[0].startswith(CONFLATED_TOPICS) and frames[0] != b"step.0":
                older = self._queued.get(frames[0])  # more than a batch waits: the head is slow or away
                if older:
                    older.clear()
                    self.skipped += 1
                    self._skips[msg.rank] = self._skips.get(msg.rank, 0) + 1
                self._queued[frames[0]] = frames
            if len(queue) == queue.maxlen:
                oldest = queue.popleft()
                if oldest:
                    self.lost += 1
                    if self._queued.get(oldest[0]) is oldest:
                        del self._queued[oldest[0]]
            queue.append(frames)

    def _sender(self, frame: zmq.Frame) -> Collection[int]:
        """The ranks of this node the connection may speak for: its own, or all when --insecure."""
        if self.gate is None:
            return self.ranks
        try:
            rank = int(frame.get("User-Id"))
        except (zmq.ZMQError, ValueError, TypeError):
            return ()
        return (rank,) if rank in self.ranks else ()

    def _flush(self) -> None:
        """The queue as batches (protocol/batch.py): the head's cost is per ZeroMQ message. A batch
        opens with what was skipped since the last (`skip_report`), before any newer message of
        those ranks."""
        queue, queued = self._queue, self._queued
        while queue:
            batch, taken = self._next_batch()
            report = skip_report(self._skips) if self._skips else None
            if not batch and report is None:
                for _ in range(taken):
                    queue.popleft()
                continue
            try:
                self._up.send(encode_batch([report, *batch] if report else batch), zmq.NOBLOCK)
            except zmq.Again:
                return  # the head is slow: the queue holds the rest (and drops its oldest when full)
            self._skips.clear()
            now = time.monotonic()
            for _ in range(taken):
                frames = queue.popleft()
                if frames:
                    self._sent.append((now, frames))
                    if queued.get(frames[0]) is frames:
                        del queued[frames[0]]
            self.forwarded += len(batch)

    def _next_batch(self) -> tuple[list[list[bytes]], int]:
        """The oldest queued messages (BATCH_MESSAGES at most, closed once it holds a megabyte),
        and how many queue entries they span (replaced ones, empty, are passed over)."""
        batch, size, taken = [], 0, 0
        for frames in self._queue:
            taken += 1
            if not frames:
                continue
            batch.append(frames)
            size += len(frames[1])
            if len(batch) == BATCH_MESSAGES or size >= MAX_FRAME_BYTES:
                break
        return batch, taken

    def _read_upstream(self) -> None:
        for _ in range(256):
            try:
                frame = self._up.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                self._head_found()
            elif frame[:1] == b"\x00":
                self._head_lost()
            elif frame.startswith(PREFIX) and len(frame) <= MAX_DOWNLINK_BYTES:
                try:
                    self._local.send(frame, zmq.NOBLOCK)
                    self.downlinked += 1
                except zmq.Again:
                    pass

    def _head_found(self) -> None:
        if self.head_up:
            return
        self.head_up = True
        if self._ever_up:
            replay = [frames for sent, frames in self._sent if sent >= self._lost_at - REPLAY_S]
            self._sent.clear()
            self.replayed += len(replay)
            self._queue = collections.deque((replay + [f for f in self._queue if f])[-self._queue.maxlen:],
                                            maxlen=self._queue.maxlen)
            down_s = time.monotonic() - self._lost_at
            lost = self.lost - self._lost_then
            self._event("info", f"node relay of ranks {_ranks(self.ranks)} reaches rank 0's relay again after "
                        f"{down_s:.1f} s; {lost} messages dropped meanwhile, {len(replay)} sent again", {
                            "state": "resumed", "ranks": sorted(self.ranks), "down_s": round(down_s, 3),
                            "lost": lost, "lost_total": self.lost, "replayed": len(replay)})
        self._ever_up = True

    def _head_lost(self) -> None:
        if not self.head_up:
            return
        self.head_up = False
        self._lost_at, self._lost_then = time.monotonic(), self.lost
        self._event("warn", f"node relay of ranks {_ranks(self.ranks)} lost rank 0's relay {self.upstream}: "
                    "those ranks are unreachable until it is back (training goes on)", {
                        "state": "lost", "ranks": sorted(self.ranks), "lost_total": self.lost})

    def _event(self, level: str, text: str, data: dict) -> None:
        if self.on_event is not None:
            try:
                self.on_event(level, text, data)
            except Exception as exc:
                self.faults.record(exc)


def _ranks(ranks: Collection[int]) -> str:
    ordered = sorted(ranks)
    if ordered and ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))
