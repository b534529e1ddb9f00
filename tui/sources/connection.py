"""The UI's network side: one thread that owns both ZeroMQ sockets.

- a SUB connected to rank 0's publish address, subscribed to everything; or, for a large run
  (`want_digests`), to everything but the ranks' steps plus the relay's digests of them
  (agent/transport/step_digest.py). Telemetry frames are multipart `[topic, msgpack_payload]` (topic = the
  message type); a single-frame message is the payload alone.
- a DEALER connected to rank 0's control address (None: no control, e.g. replay). Commands go out
  as one frame `encode(Command)`; replies come back as single frames holding an encoded `Reply`,
  handed on wrapped in `ControlReply` (rank 0 publishes each reply on telemetry too; the wrapper
  tells the view model which copy is which).

ZeroMQ sockets are not thread-safe, so both live and die on this thread. The thread polls with a
short timeout, decodes with `ringtop.protocol.decode` (bad frames are reported, never raised), and
hands what it got to `on_batch(messages, rejected)` at most every `batch_interval_s`, so a stream of
thousands of messages a second reaches the UI as a few batches a second.

A batch goes out only once the UI has folded the one before (`ack`): a UI that cannot keep up is
never fed a queue of old batches. While its batch waits longer than CONFLATE_AFTER_S, the newest
wins: a rank's step, sample or heartbeat replaces its older one still waiting, and `skipped` counts
what was replaced (the header shows it; the rank's log keeps every step).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any, Callable

import zmq

from ringtop.protocol import (
    UI_RANK,
    Command,
    Digest,
    Heartbeat,
    ProtocolError,
    Reply,
    Sample,
    Step,
    decode,
    encode,
)
from ringtop.protocol.curve import ClientKeys, HandshakeWatch, secure_client
from ringtop.protocol.guard import LoopFaults
from ringtop.protocol.messages import MESSAGE_TYPES
from ringtop.tui.sanitize import sanitized
from ringtop.tui.state.view_model import ControlReply

OnBatch = Callable[[list[Any], list[str]], None]

DIGEST_TOPIC = b"digest."
CONFLATE_AFTER_S = 0.25
"""The UI has not folded its last batch for this long: it is behind, and waiting readings conflate."""
MAX_WAITING = 20_000
"""Messages held for a UI that folds nothing (frozen): beyond, the oldest go (counted as skipped)."""
MAX_WAITING_BYTES = 16 << 20
"""Their encoded bytes, bounded too (beyond, the oldest go as above): room for MAX_WAITING_DIGESTS
of the relay's largest digests (640 KiB of steps each, agent/transport/step_digest.py), which
decode to about 2.3 times their size (~37 MB). Bounded by count alone, 20,000 frames of up to
MAX_FRAME_BYTES could wait, and a UI behind at 1024 ranks held ~100 MB of decoded digests (a trim
by count left digests that no slot tracked any more)."""
MAX_WAITING_DIGESTS = 25
"""The relay's digests held for a UI that is behind (5 s of them): a newer one takes the oldest's
place (the UI counts the gap in their `seq` as digests lost)."""
CONFLATED = (Step, Sample, Heartbeat)
BUT_STEPS = tuple(f"{tag}.".encode() for tag in MESSAGE_TYPES if tag not in ("step", "digest", "command"))
"""With digests: every telemetry type but the ranks' steps (full names: `b"he"` would match two)."""


def new_command_id() -> str:
    return uuid.uuid4().hex[:8]


class TelemetryClient:
    """Receives telemetry and replies, sends commands; all socket work on one background thread."""

    def __init__(
        self,
        publish_addr: str,
        control_addr: str | None,
        on_batch: OnBatch,
        *,
        batch_interval_s: float = 0.1,
        poll_timeout_ms: int = 50,
        rcvhwm: int = 20_000,
        max_batch: int = 20_000,
        keys: ClientKeys | None = None,
        folds_later: bool = False,
    ) -> None:
        """`keys`: the run's client keys from its connection file (None: a run started with --insecure).
        `folds_later`: `on_batch` only hands the batch on (the app posts it to its loop), and the
        next waits for `ack`; otherwise a batch is folded when `on_batch` returns."""
        self.folds_later = folds_later
        self.publish_addr = publish_addr
        self.keys = keys
        self.auth_failure = ""
        """Why the run refuses this client ("" while it does not): no keys, or wrong ones."""
        self.control_addr = control_addr
        self.on_batch = on_batch
        self.batch_interval_s = batch_interval_s
        self.poll_timeout_ms = min(int(poll_timeout_ms), 50)
        self.rcvhwm = rcvhwm
        self.max_batch = max_batch
        self._outbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0
        self.received = 0
        self.rejected = 0
        self.sent = 0
        self.callback_errors = 0
        self.skipped = 0
        """Readings replaced by a newer one of the same rank while the UI was behind."""
        self._folded = threading.Event()
        self._folded.set()
        self._posted_at = 0.0
        self._digest_slot = 0
        self._waiting_at: dict[tuple[type, int], int] = {}
        """(type, rank) -> where its latest conflatable message waits in the batch."""
        self._waiting_sizes: list[int] = []
        """Each waiting message's encoded bytes, in the batch's order (0: replaced by a newer one)."""
        self.waiting_bytes = 0
        """The encoded bytes of the messages waiting for the UI (at most MAX_WAITING_BYTES)."""
        self.faults = LoopFaults("UI receiver")
        self._want_digests = False
        self._digest_subscribed = False
        self.digests = False
        """Taking digests instead of steps (the thread's state; `want_digests` asks): from the
        first digest on, once the relay is known to build them, steps are unsubscribed."""

    # ------------------------------------------------------------------ public

    def start(self, timeout_s: float = 5.0) -> None:
        """Start the thread; raises (e.g. zmq.ZMQError for a bad address) if the sockets cannot connect."""
        if self._thread is not None:
            raise RuntimeError("TelemetryClient already started")
        self._thread = threading.Thread(target=self._run, name="ringtop-telemetry", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("telemetry thread did not start")
        if self._start_error is not None:
            self._thread.join(timeout_s)
            raise self._start_error

    @property
    def has_control(self) -> bool:
        return self.control_addr is not None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def send_command(self, cmd: str, args: dict[str, Any] | None = None) -> str:
        """Queue a command for rank 0's control socket; returns its id. Never blocks."""
        if self.control_addr is None:
            raise RuntimeError("no control address: commands cannot be sent")
        cmd_id = new_command_id()
        self._seq += 1
        self._outbox.put(Command(rank=UI_RANK, seq=self._seq, ts=time.time(), id=cmd_id, cmd=cmd,
                                 args=dict(args or {})))
        return cmd_id

    def ack(self) -> None:
        """The UI folded the last batch: the next may go. Thread-safe, never blocks."""
        self._folded.set()

    def want_digests(self, on: bool) -> None:
        """Ask for the relay's digests instead of every rank's steps (or back); never blocks. The
        thread subscribes to digests and drops the steps only when the first digest has come: the
        relay folds into digests what it forwards after it has read the subscription, and ZeroMQ
        stops the steps as soon as they are unsubscribed, so nothing is missed in between (a step
        that comes both ways is folded once, by its number)."""
        self._want_digests = bool(on)

    @property
    def wanted_digests(self) -> bool:
        return self._want_digests

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and close the sockets (the agents are not affected)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        ctx = zmq.Context()
        sub = dealer = None
        watches: list[HandshakeWatch] = []
        try:
            try:
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                secure_client(sub, self.keys)
                watches.append(HandshakeWatch(sub, self.keys is not None))
                sub.connect(self.publish_addr)
                if self.control_addr is not None:
                    dealer = ctx.socket(zmq.DEALER)
                    dealer.setsockopt(zmq.LINGER, 0)
                    dealer.setsockopt(zmq.RCVHWM, 1000)
                    dealer.setsockopt(zmq.SNDHWM, 1000)
                    secure_client(dealer, self.keys)
                    watches.append(HandshakeWatch(dealer, self.keys is not None))
                    dealer.connect(self.control_addr)
            except BaseException as exc:  # bad address etc.: report to start()
                self._start_error = exc
                return
            finally:
                self._ready.set()
            self._loop(sub, dealer, watches)
        finally:
            for w in watches:
                w.close()
            for s in (sub, dealer):
                if s is not None:
                    s.close(linger=0)
            ctx.term()

    def _loop(self, sub: zmq.Socket, dealer: zmq.Socket | None, watches: list[HandshakeWatch]) -> None:
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        if dealer is not None:
            poller.register(dealer, zmq.POLLIN)
        batch: list[Any] = []
        rejected: list[str] = []
        last_flush = time.monotonic()
        while not self._stop.is_set():
            try:
                if dealer is not None:
                    self._send_pending(dealer, rejected)
                if self._want_digests is not self._digest_subscribed:
                    self._subscribe(sub, self._want_digests)
                events = dict(poller.poll(self.poll_timeout_ms))
                if sub in events:
                    self._drain(sub, batch, rejected, "telemetry")
                if dealer is not None and dealer in events:
                    self._drain(dealer, batch, rejected, "control")
                self.auth_failure = next((f for f in (w.read() for w in watches) if f), "")
            except zmq.ContextTerminated:
                break
            except Exception as exc:  # no input may end the receiver: count it, say so, go on
                self.faults.record(exc)
                rejected.append(f"receiver: ignored an unexpected {type(exc).__name__}")
            now = time.monotonic()
            if (batch or rejected) and now - last_flush >= self.batch_interval_s and self._folded.is_set():
                self._flush(batch, rejected)
                batch, rejected = [], []
                last_flush = self._posted_at = now
        if batch or rejected:
            self._flush(batch, rejected)

    def _subscribe(self, sub: zmq.Socket, digests: bool) -> None:
        """Digests: subscribe to them (and to every other type by name); the steps go at the first
        digest (`_drain`). Back: every step again, then no digests."""
        if digests:
            for topic in (DIGEST_TOPIC, *BUT_STEPS):
                sub.setsockopt(zmq.SUBSCRIBE, topic)
        else:
            if self.digests:
                sub.setsockopt(zmq.SUBSCRIBE, b"")
            for topic in (DIGEST_TOPIC, *BUT_STEPS):
                sub.setsockopt(zmq.UNSUBSCRIBE, topic)
            self.digests = False
        self._digest_subscribed = digests

    def _drain(self, sock: zmq.Socket, batch: list[Any], rejected: list[str], channel: str) -> None:
        behind = not self._folded.is_set() and time.monotonic() - self._posted_at >= CONFLATE_AFTER_S
        for _ in range(self.max_batch):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            if len(frames) == 2 and frames[0].startswith(DIGEST_TOPIC):
                if not self._digest_subscribed:
                    continue  # another UI's digests: this one takes every step
                if not self.digests:  # the relay builds them: the steps can go
                    sock.setsockopt(zmq.UNSUBSCRIBE, b"")
                    self.digests = True
            payload = _payload(frames)
            if payload is None:
                self.rejected += 1
                rejected.append(f"{channel}: unexpected message of {len(frames)} frames")
                continue
            try:
                msg = decode(payload)
            except ProtocolError as exc:
                self.rejected += 1
                rejected.append(f"{channel}: {exc.code}: {exc.message}")
                continue
            msg = sanitized(msg)
            if channel == "control":
                if not isinstance(msg, Reply):
                    self.rejected += 1
                    rejected.append(f"control: expected a reply, got a {type(msg).__name__} message")
                    continue
                msg = ControlReply(msg)
            self.received += 1
            kind = type(msg)
            if kind in CONFLATED and (msg.rank != 0 or kind is not Step):
                self._conflate(batch, (kind, msg.rank), behind)
            elif kind is Digest:
                self._digest_slot = (self._digest_slot + 1) % MAX_WAITING_DIGESTS
                self._conflate(batch, (kind, self._digest_slot), behind)
            size = len(payload)
            if len(batch) >= MAX_WAITING or self.waiting_bytes + size > MAX_WAITING_BYTES:
                self._trim(batch)
            batch.append(msg)
            self._waiting_sizes.append(size)
            self.waiting_bytes += size

    def _trim(self, batch: list[Any]) -> None:
        """The oldest go, until at most half of each bound waits (counted as skipped); the rest
        stay where `_waiting_at` finds them, so a newer reading or digest still replaces them."""
        sizes, kept_bytes, cut = self._waiting_sizes, self.waiting_bytes, 0
        while cut < len(batch) and (len(batch) - cut > MAX_WAITING // 2 or kept_bytes > MAX_WAITING_BYTES // 2):
            kept_bytes -= sizes[cut]
            cut += 1
        self.skipped += sum(1 for m in batch[:cut] if m is not None)
        del batch[:cut]
        del sizes[:cut]
        self.waiting_bytes = kept_bytes
        self._waiting_at = {key: at - cut for key, at in self._waiting_at.items() if at >= cut}

    def _conflate(self, batch: list[Any], key: tuple, behind: bool) -> None:
        """The message about to be appended replaces the waiting one under `key`, if behind."""
        waiting = self._waiting_at
        at = waiting.get(key)
        if behind and at is not None and at < len(batch) and batch[at] is not None:
            batch[at] = None
            self.waiting_bytes -= self._waiting_sizes[at]
            self._waiting_sizes[at] = 0
            self.skipped += 1
        waiting[key] = len(batch)

    def _send_pending(self, dealer: zmq.Socket, rejected: list[str]) -> None:
        while True:
            try:
                cmd = self._outbox.get_nowait()
            except queue.Empty:
                return
            try:
                dealer.send(encode(cmd), zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:
                rejected.append(f"control: command {cmd.cmd} [{cmd.id}] not sent: control socket is full")

    def _flush(self, batch: list[Any], rejected: list[str]) -> None:
        self._waiting_at.clear()
        self._waiting_sizes.clear()
        self.waiting_bytes = 0
        self._folded.clear()
        try:
            self.on_batch([m for m in batch if m is not None], rejected)
        except Exception:  # the UI may be closing; never let the thread die of it
            self.callback_errors += 1
            self._folded.set()
        if not self.folds_later:
            self._folded.set()


def _payload(frames: list[bytes]) -> bytes | None:
    """`[payload]`, `[topic, payload]`, or a DEALER reply with an empty delimiter `[b"", payload]`."""
    if len(frames) == 1:
        return frames[0]
    if len(frames) == 2:
        return frames[1]
    if len(frames) == 3 and frames[0] == b"":
        return frames[2]
    return None
