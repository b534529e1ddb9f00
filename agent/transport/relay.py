"""Rank 0's relay: every rank publishes into its XSUB, every UI subscribes to its XPUB.

A plain `zmq.proxy` would do the forwarding, but a UI that attaches mid-run would then never see
the ranks' Hello messages. The relay keeps the latest Hello, Bye and pipeline Timeline of each rank
and re-sends them whenever a new subscription arrives, so any UI can attach (or re-attach) at any
time and draw at once.

It forwards and caches only what is real: a message that decodes, whose topic is its own
`type.rank`, whose rank is a rank of this run and the rank whose key sent it (rank 0 publishes the
control replies), and whose Hello carries this run's id and world size. Anything else is counted
and dropped, so a forged frame can neither change what UIs show nor be replayed to every UI that
attaches later.

A UI of a large run subscribes to `digest.` instead of `step.`: every 0.2 s it gets each rank's
latest step whole and the older ones by their numbers (agent/transport/step_digest.py), built from what the
relay forwards and only while some UI asks for them.

On several nodes a node relay (agent/transport/node_relay.py) forwards its node's ranks through one
connection, in batches (protocol/batch.py: its cost here is per ZeroMQ message, and one batch holds
up to 64), each message in one checked as if it had come alone; its key may carry exactly those
ranks (`carriers`), so a node relay gone bad cannot speak for a rank of another node either.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Collection, Mapping

import msgspec
import zmq

from ringtop.agent.transport.gatekeeper import Gatekeeper
from ringtop.agent.transport.ports import BindError, bind
from ringtop.agent.transport.relay_checks import SKIPPED_TOPIC, conflatable, real, topic_rank
from ringtop.agent.transport.step_digest import StepDigest
from ringtop.metrics.goodput import Goodput
from ringtop.metrics.lag import Lag
from ringtop.protocol import (
    UI_RANK,
    GoodputSoFar,
    Message,
    ProtocolError,
    RankExit,
    RankLook,
    RecentSteps,
    Step,
    StepBrief,
    decode,
    encode,
)
from ringtop.protocol.batch import decode_batch
from ringtop.protocol.curve import CLIENT_DOMAIN, RELAY_DOMAIN, close_monitored
from ringtop.protocol.guard import LoopFaults
from ringtop.protocol.messages import MAX_RECENT_BRIEFS, MESSAGE_TYPES

CACHED_TOPICS = (b"hello.", b"bye.", b"timeline.")
DIGEST_TOPIC = b"digest."
"""A subscription to it asks for conflated steps (agent/transport/step_digest.py); published as `digest.-1`."""
_TAGS = {cls: tag for tag, cls in MESSAGE_TYPES.items()}
_send = zmq.backend.Socket.send
"""libzmq's send without pyzmq's Python layer (a third of a forward's time, per frame)."""
_SNDMORE = int(zmq.SNDMORE)
BURST_MESSAGES = 4096
"""The relay takes at most this many messages in one go; a burst this full means more wait (about
a third of a second of a 1024-rank run at 10 Hz), and the newest of each rank wins."""
CONFLATE_AFTER_S = 0.5
"""The relay's input this far behind (half the lag at which a UI says it is behind): skip."""
INPUT_HWM = 16
INPUT_BUFFER_BYTES = 64 << 10
"""Per input connection, what waits on the relay's side (ZeroMQ messages: a node relay's batches;
the kernel's buffer): small, so what a busy relay has not read waits at the sender, where a rank's
queue and a node relay's keep the newest, instead of seconds of it here, read stale."""
WATCHERS_TOPICS = (b"exit.-1", b"look.-1")
"""A node watcher's word of one of its ranks (protocol `exit`, `look`), in its node relay's batch."""
_skips_decoder = msgspec.msgpack.Decoder(list[int])
RECENT_STEPS_PER_RANK = 120
"""Steps of each rank kept for a UI that attaches (half the UI's chart)..."""
RECENT_STEPS_BUDGET = 32_768
"""...and at most this many in all: at 1024 ranks, each rank's last 32."""


def recent_steps_per_rank(world_size: int | None) -> int:
    return max(8, min(RECENT_STEPS_PER_RANK, RECENT_STEPS_BUDGET // max(1, world_size or 1)))


class Relay(threading.Thread):
    def __init__(self, relay_address: str, publish_address: str, context: zmq.Context | None = None,
                 run_id: str | None = None, world_size: int | None = None, gate: Gatekeeper | None = None,
                 movable: Collection[str] = (), observers: Collection[Callable[[Message], None]] = (),
                 carriers: Mapping[str, Collection[int]] | None = None, count_goodput: bool = True):
        """`gate`: both sockets authenticate through it (None: plain sockets, --insecure).
        `carriers`: the ranks each node relay's connection (by its ZAP user id) may carry.
        `movable`: which of "relay" and "publish" are defaults, which move to free ports when taken.
        `observers`: called on the relay's thread with each message it forwards (already validated),
        e.g. the hang watch and the Prometheus exporter; one that raises is counted, never fatal.
        `count_goodput`: fold every message into the run's goodput, which each new subscriber gets
        after the replayed Hellos (metrics/goodput.py: a UI attaching mid-run).
        Long by design: every socket option and every counter, each with its docstring, set here
        before the thread starts and owns them."""
        super().__init__(name="ringtop-relay", daemon=True)
        self.run_id = run_id
        """Hellos of another run are dropped (None: not checked)."""
        self.world_size = world_size
        """Messages of ranks outside 0..world_size-1 are dropped (None: not checked)."""
        self.dropped = 0
        self.faults = LoopFaults("relay")
        ctx = gate.context if gate is not None else (context or zmq.Context.instance())
        self._backend = ctx.socket(zmq.XSUB)
        self._frontend = ctx.socket(zmq.XPUB)
        self._backend.setsockopt(zmq.RCVHWM, INPUT_HWM)
        self._backend.setsockopt(zmq.RCVBUF, INPUT_BUFFER_BYTES)
        self._frontend.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._frontend.setsockopt(zmq.SNDHWM, 10_000)
        for sock in (self._backend, self._frontend):
            sock.setsockopt(zmq.LINGER, 500)
        if gate is not None:
            gate.secure(self._backend, "relay input", RELAY_DOMAIN)
            gate.secure(self._frontend, "telemetry", CLIENT_DOMAIN)
        self._authenticated = gate is not None
        """Each input connection then carries its rank as ZAP user id: a message must be its sender's."""
        self._carried: dict[str, frozenset[int]] = {u: frozenset(r) for u, r in (carriers or {}).items()}
        """ZAP user id -> the ranks its messages may be of (a rank's own id is added when first seen)."""
        self._replaying = frozenset(self._carried.values())
        """The node relays' allow-lists (by identity): what comes through one may come twice."""
        try:
            self.relay_address = bind(self._backend, relay_address, "relay" in movable, "relay input", "--relay")
            self.publish_address = bind(self._frontend, publish_address, "publish" in movable, "telemetry", "--publish")
        except BindError:
            close_monitored(self._backend, 0)
            close_monitored(self._frontend, 0)
            raise
        self._backend.send(b"\x01")
        self._cache: dict[bytes, list[bytes]] = {}
        self._stop_event = threading.Event()
        self.forwarded = 0
        self.gaps = 0
        """Messages of the ranks that never arrived (gaps in their `seq`): dropped by a rank's full
        queue, or lost on the way (a node relay cut off from here)."""
        self._last_seq: dict[int, int] = {}
        """Each rank's latest `seq`: a rank's messages come in order (one connection, or one node relay's)."""
        self.duplicates = 0
        self.skipped = 0
        """A rank's steps, samples and heartbeats left out while the relay was behind, each for a
        newer one of the same rank (`conflatable`): the UIs are told, and a rank's log keeps them."""
        self.lag = Lag()
        """How far behind the ranks the relay's input is (metrics/lag.py): from the last message of
        each burst; at CONFLATE_AFTER_S the newest of each rank wins."""
        self._last_ts = 0.0
        self._skipped_since: dict[int, int] = {}
        """Per rank, skipped messages not yet matched with a gap in its `seq` (a node relay reports
        its skips before the messages that follow them): such a gap is none."""
        self.observers = list(observers)
        self.goodput = Goodput() if count_goodput else None
        if self.goodput is not None:
            self.observers.append(self.goodput.add)
        self._downlink: collections.deque[bytes] = collections.deque(maxlen=64)
        self._own: collections.deque[tuple[Message, bytes | None]] = collections.deque(maxlen=1024)
        """The relay's holder's own messages (the watcher's RankExit and, once rank 0 is gone, its
        verdicts), queued from any thread, each with its cache slot (None: not kept)."""
        self.digest = StepDigest()
        self._digest_wanted = False
        """Some UI subscribes to `digest.` (XPUB_VERBOSE passes every subscription; the
        unsubscription comes once the last such subscriber has gone)."""
        self._next_digest = 0.0
        self.digests_sent = 0
        self._recent: dict[int, collections.deque[StepBrief]] = {}
        """Each rank's last steps (`recent_steps_per_rank`), for the next UI that subscribes."""
        self._recent_len = recent_steps_per_rank(world_size)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Started: ends the thread, which closes its sockets. Never started: closes them here,
        on the thread that made them (a set-up that failed after this relay bound)."""
        self._stop_event.set()
        if self.ident is None:
            close_monitored(self._backend, 0)
            close_monitored(self._frontend, 0)
            return
        self.join(timeout_s)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._backend, zmq.POLLIN)
        poller.register(self._frontend, zmq.POLLIN)
        try:
            while True:
                events: dict = {}
                try:
                    events = dict(poller.poll(50))
                    if self._frontend in events:  # first: a new UI's replay before the steps it would already get
                        self._handle_subscriptions()
                    if self._backend in events:
                        self._forward_all()
                    if self._downlink:
                        self._send_downlink()
                    if self._own:
                        self._send_own()
                    if self._digest_wanted:
                        self._send_digests()
                except zmq.ContextTerminated:
                    return
                except Exception as exc:  # never let the relay die
                    self.faults.record(exc)
                if self._stop_event.is_set() and not events:
                    return
        finally:
            close_monitored(self._backend)
            close_monitored(self._frontend)

    def _forward_all(self) -> None:
        """One burst: what is queued, up to BURST_MESSAGES, read before any is decoded."""
        burst: list[tuple[list[bytes], Collection[int] | None]] = []
        taken = 0
        while taken < BURST_MESSAGES:  # bounded: new subscribers, the downlink and a stop are seen in between
            try:
                parts = self._backend.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            sender = self._sender(parts[-1])
            if len(parts) == 1:
                frames = decode_batch(parts[0].bytes)
            else:
                frames = [p.bytes for p in parts] if len(parts) == 2 else None
            if frames is None:
                self.dropped += 1
                taken += 1
                continue
            burst.append((frames, sender))
            taken += max(1, len(frames) // 2)
        self.forward_burst(burst, full=taken >= BURST_MESSAGES)

    def forward_burst(self, burst: list[tuple[list[bytes], Collection[int] | None]], full: bool) -> None:
        """While the relay is behind (its input CONFLATE_AFTER_S late, or more queued than one
        burst takes: `full`), the newest wins: a rank's older step, sample or heartbeat in the
        burst is skipped (`conflatable`), so the relay catches up at the cost of a topic check per
        skipped message instead of a decode."""
        behind = full or self.lag.behind_s() >= CONFLATE_AFTER_S
        newest = conflatable(burst) if behind and burst else None
        before = self.forwarded
        for i, (frames, sender) in enumerate(burst):
            self._forward(frames, sender, newest, i)
        if self.forwarded > before:  # the burst's last forwarded message: as late as the burst
            self.lag.observe(time.time() - self._last_ts, time.monotonic())

    def _forward(self, frames: list[bytes], sender: Collection[int] | None,
                 newest: dict[tuple[bytes, int], tuple[int, int]] | None = None, at: int = 0) -> None:
        """`frames`: topic, message, topic, message... of one sender, message `at` of a burst whose
        `newest` (None: not behind) says where each conflatable topic last occurs. One loop, names
        bound locally: per message this is the relay's whole cost."""
        front, last_seq, observers = self._frontend, self._last_seq, self.observers
        digest = self.digest if self._digest_wanted else None
        run_id, world_size = self.run_id, self.world_size
        for i in range(0, len(frames), 2):
            topic, body = frames[i], frames[i + 1]
            if topic == SKIPPED_TOPIC:
                self._take_skips(body, sender)
                continue
            if topic in WATCHERS_TOPICS:
                self._take_watchers_word(body, sender)
                continue
            if newest is not None:
                where = newest.get((topic, id(sender)))
                if where is not None and where != (at, i):
                    self.skipped += 1  # a newer one of this rank follows in the same burst
                    rank = topic_rank(topic)
                    if rank in last_seq:  # before a rank's first message there is no gap to excuse
                        skipped = self._skipped_since
                        skipped[rank] = skipped.get(rank, 0) + 1
                    continue
            msg = real(topic, body, sender, run_id, world_size)
            if msg is None:
                self.dropped += 1
                continue
            last = last_seq.get(msg.rank)
            if last is not None and msg.seq <= last:
                if any(sender is carried for carried in self._replaying):
                    self.duplicates += 1  # sent again by a node relay that lost its connection
                    continue
            else:
                if last is not None and msg.seq > last + 1:
                    self._count_gap(msg.rank, msg.seq - last - 1)
                last_seq[msg.rank] = msg.seq
            self._last_ts = msg.ts
            if topic.startswith(CACHED_TOPICS):
                self._cache[topic] = [topic, body]  # one per topic, and topics are bounded by the ranks
            _send(front, topic, _SNDMORE)
            _send(front, body, 0)
            self.forwarded += 1
            if type(msg) is Step:
                self._keep_recent(msg)
                if digest is not None:
                    digest.add(msg, len(body))
            for observe in observers:
                try:
                    observe(msg)
                except Exception as exc:  # an observer's bug must not stop the forwarding
                    self.faults.record(exc)

    def _count_gap(self, rank: int, missing: int) -> None:
        """Messages missing from a rank's `seq`: those it was told were skipped are not gaps."""
        credit = self._skipped_since.get(rank, 0)
        if credit:
            used = min(credit, missing)
            missing -= used
            if credit > used:
                self._skipped_since[rank] = credit - used
            else:
                del self._skipped_since[rank]
        self.gaps += missing

    def _take_skips(self, body: bytes, sender: Collection[int] | None) -> None:
        """A node relay's `skip_report`: for its own ranks only, else dropped."""
        if sender is not None and not any(sender is carried for carried in self._replaying):
            self.dropped += 1
            return
        try:
            pairs = _skips_decoder.decode(body) if len(body) <= 64 * 1024 else []
        except (msgspec.ValidationError, msgspec.DecodeError):
            pairs = []
        if not pairs or len(pairs) % 2:
            self.dropped += 1
            return
        for rank, count in zip(pairs[::2], pairs[1::2]):
            if 0 < count < 1 << 31 and (sender is None or rank in sender):
                self.skipped += count
                self._skipped_since[rank] = self._skipped_since.get(rank, 0) + count

    def _take_watchers_word(self, body: bytes, sender: Collection[int] | None) -> None:
        """A node watcher's RankExit or RankLook, through its node relay: taken only for a rank that
        relay carries (a rank's own connection cannot say another, or itself, has died)."""
        if sender is not None and not any(sender is carried for carried in self._replaying):
            self.dropped += 1
            return
        try:
            msg = decode(body)
        except ProtocolError:
            msg = None
        if (type(msg) not in (RankExit, RankLook) or msg.rank != UI_RANK
                or (sender is not None and msg.of_rank not in sender)
                or (self.world_size is not None and msg.of_rank >= self.world_size)):
            self.dropped += 1
            return
        self.publish_own(msg, keep=f"exit.{msg.of_rank}".encode() if type(msg) is RankExit else None)

    def send_down(self, frame: bytes) -> None:
        """Thread-safe: `frame` goes to every rank's telemetry socket (an XSUB passes a message that
        is not a subscription up to every publisher): the ranks' way to hear rank 0 without their
        training threads, which may be stuck."""
        self._downlink.append(frame)

    def publish_own(self, msg: Message, keep: bytes | None = None) -> None:
        """Thread-safe: `msg` (UI_RANK's: the relay's holder speaks for no rank) to every UI; `keep`
        names a cache slot, so a UI that attaches later gets the latest message of that slot too.
        A RankExit or RankLook is also shown to the observers (the hang watch then knows the rank
        is gone, or alive)."""
        self._own.append((msg, keep))

    def _send_own(self) -> None:
        while self._own:
            msg, keep = self._own.popleft()
            topic, body = f"{_TAGS[type(msg)]}.{msg.rank}".encode(), encode(msg)
            if keep is not None:
                self._cache[keep] = [topic, body]
            self._frontend.send_multipart([topic, body])
            if type(msg) in (RankExit, RankLook):
                for observe in self.observers:
                    try:
                        observe(msg)
                    except Exception as exc:
                        self.faults.record(exc)

    def has_downlink(self) -> bool:
        return bool(self._downlink)

    def _send_downlink(self) -> None:
        while self._downlink:
            frame = self._downlink.popleft()
            try:
                self._backend.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _sender(self, frame: zmq.Frame) -> Collection[int] | None:
        """The ranks the sending connection's key may speak for (None: not authenticated)."""
        if not self._authenticated:
            return None
        try:
            user = frame.get("User-Id")
        except zmq.ZMQError:
            return ()
        carried = self._carried.get(user)
        if carried is None:
            try:
                carried = frozenset({int(user)})
            except (ValueError, TypeError):
                carried = frozenset()  # no rank: never matches a message's
            if len(self._carried) < 1 << 16:
                self._carried[user] = carried
        return carried

    def _handle_subscriptions(self) -> None:
        new_subscriber = False
        while True:
            try:
                frame = self._frontend.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            new_subscriber |= frame[:1] == b"\x01"
            if frame[1:] == DIGEST_TOPIC and frame[:1] in (b"\x00", b"\x01"):
                self._digest_wanted = frame[:1] == b"\x01"
                if not self._digest_wanted:
                    self.digest.clear()
        if new_subscriber:
            for frames in sorted(self._cache.values(), key=lambda f: not f[0].startswith(b"hello.")):
                self._frontend.send_multipart(frames)
            so_far = self._goodput_so_far()
            if so_far is not None:
                self._frontend.send_multipart([b"goodput.-1", encode(so_far)])
            for recent in self.recent_steps():
                self._frontend.send_multipart([b"recent.-1", encode(recent)])

    def _keep_recent(self, msg: Step) -> None:
        kept = self._recent.get(msg.rank)
        if kept is None:
            kept = self._recent[msg.rank] = collections.deque(maxlen=self._recent_len)
        while kept and kept[-1].step >= msg.step:  # sent again, or a rank that started over
            kept.pop()
        kept.append(StepBrief(msg.rank, msg.step, msg.ts, msg.step_ms, msg.loss, msg.grad_norm, msg.skipped))

    def recent_steps(self) -> list[RecentSteps]:
        """The kept steps in step order (ranks interleaved, as they came), in messages of at most
        MAX_RECENT_BRIEFS."""
        briefs = sorted((b for kept in self._recent.values() for b in kept), key=lambda b: (b.step, b.rank))
        now = time.time()
        return [RecentSteps(rank=UI_RANK, ts=now, briefs=briefs[i:i + MAX_RECENT_BRIEFS])
                for i in range(0, len(briefs), MAX_RECENT_BRIEFS)]

    def _send_digests(self) -> None:
        now = time.monotonic()
        if now < self._next_digest:
            return
        self._next_digest = now + self.digest.interval_s
        for d in self.digest.take(time.time(), self.gaps, self.skipped):
            try:
                self._frontend.send_multipart([b"digest.-1", encode(d)], zmq.NOBLOCK)
                self.digests_sent += 1
            except zmq.Again:
                pass  # every subscriber's queue is full: it will count the gap in `seq`

    def _goodput_so_far(self) -> GoodputSoFar | None:
        state = self.goodput.state() if self.goodput is not None else None
        if state is None or not state.run_id:
            return None
        return GoodputSoFar(
            rank=UI_RANK, ts=state.as_of_ts, run_id=state.run_id, world_size=state.world_size or self.world_size or 0,
            started_ts=state.started_ts, as_of_ts=state.as_of_ts, first_step_start_ts=state.first_step_start_ts,
            step_end_ts=state.step_end_ts, steps=state.steps, productive_s=state.productive_s,
            checkpoint_s=state.checkpoint_s, switch_s=state.switch_s, skipped_s=state.skipped_s,
            stall_closed_s=state.stall_closed_s, startup_s=state.startup_s, open_stalls=list(state.open_stalls),
            recent_steps=list(state.recent_steps), recent_stalls=list(state.recent_stalls),
            restart_s=state.restart_s, restarts=state.restarts, restart_from_ts=state.restart_from_ts,
            redo_through_step=state.redo_through_step, top_step=state.top_step)
