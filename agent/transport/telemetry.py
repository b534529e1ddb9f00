"""Gets telemetry off the training thread at once.

`emit` stamps the envelope and appends to a bounded deque (the oldest message is dropped and
counted when it is full); a background thread encodes and sends over an XPUB socket connected to
rank 0's relay and appends JSON lines to `rank-R.jsonl` (private, no link followed), flushed per
line. The thread also sends a heartbeat every second, so a UI can tell a slow step from a dead rank.
A log-only message (protocol LOG_ONLY: each step's collectives) goes to the log alone, under the
previous message's `seq`, so the relay and the UI count no gap for it.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time
from typing import Callable

import zmq

from ringtop.metrics.rules.liveness import HEARTBEAT_S
from ringtop.protocol import Bye, Heartbeat, Message, encode, safe_files, to_json_line
from ringtop.protocol.curve import ClientKeys, secure_client
from ringtop.protocol.guard import LoopFaults
from ringtop.protocol.messages import LOG_ONLY

QUEUE_CAPACITY = 4096
HEARTBEAT_INTERVAL_S = HEARTBEAT_S
SUBSCRIPTION_WAIT_S = 5.0


def topic(msg: Message) -> bytes:
    """`type.rank`: subscribers filter by type prefix; the relay caches per rank."""
    return f"{msg.__struct_config__.tag}.{msg.rank}".encode()


class Telemetry:
    def __init__(
        self,
        rank: int,
        relay_address: str | None,
        log_dir: str | None,
        context: zmq.Context | None = None,
        capacity: int = QUEUE_CAPACITY,
        keys: ClientKeys | None = None,
    ):
        """`keys`: the run's client keys, to get into the relay (None: --insecure)."""
        self.rank = rank
        self.drops = 0
        self.failures = 0
        self.faults = LoopFaults(f"telemetry [rank {rank}]")
        self.step = -1
        """Last step published; heartbeats start once the runner sets it (after the Hello)."""
        self._seq = itertools.count()
        self._last_seq = 0
        self._queue: collections.deque[Message] = collections.deque(maxlen=capacity)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._sealed = False
        """Set with the Bye: a reader relies on the Bye being a rank's last message."""
        self._emit_lock = threading.Lock()
        self._socket: zmq.Socket | None = None
        self._subscribed = relay_address is None
        self._connected_at = time.monotonic()
        if relay_address is not None:
            ctx = context or zmq.Context.instance()
            self._socket = ctx.socket(zmq.XPUB)
            self._socket.setsockopt(zmq.SNDHWM, capacity)
            self._socket.setsockopt(zmq.LINGER, 2000)
            secure_client(self._socket, keys)
            self._socket.connect(relay_address)
        self.on_downlink: Callable[[bytes], None] | None = None
        """Called on this thread with each frame rank 0's relay sends down (protocol/downlink.py)."""
        self._file = None
        if log_dir:
            folder = safe_files.open_dir(log_dir, what="log folder")
            try:
                self._file = safe_files.open_append(folder, f"rank-{rank}.jsonl")
            finally:
                os.close(folder)
        self._thread = threading.Thread(target=self._run, name=f"ringtop-telemetry-{rank}", daemon=True)
        self._thread.start()

    def emit(self, msg: Message) -> None:
        """Non-blocking; safe from any thread. After the Bye nothing more is sent."""
        with self._emit_lock:
            if self._sealed:
                return
            self._sealed = isinstance(msg, Bye)
            msg.rank = self.rank
            if type(msg) in LOG_ONLY:
                msg.seq = self._last_seq
            else:
                msg.seq = self._last_seq = next(self._seq)
            msg.ts = time.time()
            if len(self._queue) == self._queue.maxlen:
                self.drops += 1
            self._queue.append(msg)
        self._wake.set()

    @property
    def has_log(self) -> bool:
        """Whether it writes a log (where a log-only message is of any use)."""
        return self._file is not None

    @property
    def queued(self) -> int:
        return len(self._queue)

    def close(self, bye: Bye | None = None, timeout_s: float = 10.0, linger_s: float = 3.0) -> None:
        """Send what is queued (and a Bye), then stop the thread. Waits at most `timeout_s` for the
        thread to write the log (a rank stopped on a loaded node still ends its log with the Bye;
        3 s were too few with every core busy) and lets the socket try `linger_s` more to send."""
        if bye is not None:
            self.emit(bye)
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close(linger=int(linger_s * 1000) if self._subscribed else 0)
        if self._file is not None:
            self._file.close()

    def _run(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
        while True:
            closing = self._closing.is_set()
            self._wake.wait(0.05)
            self._wake.clear()
            try:
                self._await_subscription()
                if not closing and self.step >= 0 and time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
                    self.emit(Heartbeat(step=self.step, drops=self.drops, queued=len(self._queue)))
                if self._subscribed or closing:
                    self._flush_queue()
                if self._subscribed and self._socket is not None and not closing:
                    self._read_downlink()
            except Exception as exc:  # never let the rank's telemetry die: count it, back off, go on
                self.faults.record(exc)
            if closing:
                return

    def _report_failure(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures <= 3:
            print(f"ringtop telemetry [rank {self.rank}]: dropped a message: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)

    def _await_subscription(self) -> None:
        """An XPUB learns the relay's subscription from a frame; until then sends would be lost."""
        if self._subscribed or self._socket is None:
            return
        try:
            while True:
                frame = self._socket.recv(zmq.NOBLOCK)
                if frame[:1] == b"\x01":
                    self._subscribed = True
                    return
        except zmq.Again:
            pass
        if time.monotonic() - self._connected_at > SUBSCRIPTION_WAIT_S:
            self._subscribed = True

    def _read_downlink(self) -> None:
        for _ in range(64):  # bounded: a flood from the relay cannot hold up the sending
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            if frame[:1] in (b"\x00", b"\x01") or self.on_downlink is None:
                continue
            try:
                self.on_downlink(frame)
            except Exception as exc:  # a bad frame or handler must not end telemetry
                self._report_failure(exc)

    def _flush_queue(self) -> None:
        while self._queue:
            try:
                msg = self._queue.popleft()
            except IndexError:
                return
            lost = False
            if self._file is not None:  # the log first: a socket that fails must not cost the record
                try:
                    self._file.write(to_json_line(msg))
                except Exception as exc:  # a bad message or a full disk must not kill telemetry or training
                    lost = True
                    self._report_failure(exc)
            if self._socket is not None and self._subscribed and type(msg) not in LOG_ONLY:
                try:
                    self._socket.send_multipart([topic(msg), encode(msg)], zmq.NOBLOCK)
                except zmq.Again:
                    lost = True
                except Exception as exc:  # a closed context, a message that does not encode
                    lost = True
                    self._report_failure(exc)
            self.drops += lost
