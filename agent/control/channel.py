"""The control channel: rank 0 serves commands; every rank applies them on the same step.

A thread on rank 0 owns a ROUTER socket. It validates each command as it arrives, answers
`status` at once from a snapshot, and queues the rest with an `ack`. At each step boundary the
training thread of rank 0 broadcasts the queued commands to all ranks over a small gloo group (a
CPU tensor even on NCCL runs, so no device synchronisation), and every rank acts on them.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import msgspec
import torch
import torch.distributed as dist
import zmq

from ringtop.agent.control.operations_log import OperationsLog
from ringtop.agent.transport.gatekeeper import Gatekeeper
from ringtop.agent.transport.ports import BindError, bind
from ringtop.protocol import (
    IMMEDIATE_COMMANDS,
    MAX_FRAME_BYTES,
    Command,
    ProtocolError,
    Reply,
    decode,
    encode,
    validate_command,
)
from ringtop.protocol.curve import CLIENT_DOMAIN, close_monitored
from ringtop.protocol.guard import LoopFaults
from ringtop.protocol.messages import MAX_ID_CHARS
from ringtop.protocol.rate_limit import PeerLimiter, Verdict

MAX_PENDING_COMMANDS = 16
TRANSPORT_MAX_FRAME_BYTES = 64 * MAX_FRAME_BYTES
"""Largest frame ZeroMQ reads for us: one up to this size is answered `oversize`; a larger one
closes the sender's connection (ZeroMQ cannot skip it), so no frame buffers more than this."""
RECEIVE_HWM = 8
"""Frames ZeroMQ holds per peer before it stops reading that peer's connection: a flood waits in
its own socket buffers, and at most 8 frames of the largest size are held per peer."""


@dataclass
class PendingCommand:
    command: Command
    args: Any
    identity: bytes | None = None


class ControlServer(threading.Thread):
    def __init__(
        self,
        address: str,
        snapshot: Callable[[], dict[str, Any]],
        publish_reply: Callable[[Reply], None],
        context: zmq.Context | None = None,
        gate: Gatekeeper | None = None,
        movable: bool = False,
        restate_operations: Callable[[dict[str, Any]], None] | None = None,
        immediate: dict[str, Callable[[Command, Any], Any]] | None = None,
        on_stop: Callable[[str], None] | None = None,
        limiter: PeerLimiter | None = None,
    ):
        """`gate`: the socket authenticates through it (None: a plain socket, --insecure).
        `movable`: a default address, which moves to a free port when taken.
        `restate_operations`: called from this thread every few seconds with the latest operations
        (operations_log.py), for UIs that attach later.
        `immediate`: handlers of the immediate commands other than `status`, called on this thread
        with the command and its arguments; each returns the result, or a function this thread
        polls with the time until it returns the result (an answer gathered from the ranks).
        `on_stop`: told of each `stop` as it is queued (a stuck run is stopped without its
        training thread: stall_watch.py).
        `limiter`: how many frames each peer may send (protocol/rate_limit.py; None: its defaults)."""
        super().__init__(name="ringtop-control", daemon=True)
        self._snapshot = snapshot
        self._immediate = dict(immediate or {})
        self._on_stop = on_stop
        self._answering: list[tuple[Command, Callable[[float], Any]]] = []
        self._publish_reply = publish_reply
        self._restate = restate_operations
        self.operations = OperationsLog()
        ctx = gate.context if gate is not None else (context or zmq.Context.instance())
        self._socket = ctx.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 500)
        self._socket.setsockopt(zmq.MAXMSGSIZE, TRANSPORT_MAX_FRAME_BYTES)
        self._socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        if gate is not None:
            gate.secure(self._socket, "control", CLIENT_DOMAIN)
        try:
            self.address = bind(self._socket, address, movable, "control", "--control")
        except BindError:
            close_monitored(self._socket, 0)
            raise
        self._pending: queue.Queue[PendingCommand] = queue.Queue(MAX_PENDING_COMMANDS)
        self._own_ids = itertools.count(1)
        self._identities: dict[str, bytes] = {}
        self._outgoing: collections.deque[tuple[bytes | None, Reply]] = collections.deque()
        self._seq = itertools.count()
        self._stop_event = threading.Event()
        self.rejected = 0
        self.limiter = limiter or PeerLimiter()
        self.faults = LoopFaults("control server")

    def stop(self, timeout_s: float = 2.0) -> None:
        """Started: ends the thread, which closes its socket. Never started: closes it here."""
        self._stop_event.set()
        if self.ident is None:
            close_monitored(self._socket, 0)
            return
        self.join(timeout_s)

    def inject(self, cmd: str, args: dict[str, Any]) -> bool:
        """A command of the run's own (a capture on trigger), queued as a client's would be and
        validated the same way; its replies are published, answered to no one. False when the
        queue is full (it is dropped: the run's clients come first)."""
        command = Command(id=f"own-{next(self._own_ids)}", cmd=cmd, args=args, rank=0, ts=time.time())
        parsed = validate_command(command)
        try:
            self._pending.put_nowait(PendingCommand(command, parsed, None))
        except queue.Full:
            return False
        return True

    def take_pending(self) -> list[PendingCommand]:
        taken = []
        while True:
            try:
                taken.append(self._pending.get_nowait())
            except queue.Empty:
                return taken

    def reply(self, command: Command, status: str, result: dict[str, Any] | None = None,
              error: str = "", code: str = "") -> None:
        """Thread-safe: queued for the control thread, which owns the socket."""
        msg = Reply(id=command.id, status=status, cmd=command.cmd, result=result or {}, error=error, code=code)
        self._outgoing.append((self._identities.get(command.id), msg))
        if status != "ack":
            self._identities.pop(command.id, None)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        try:
            while not self._stop_event.is_set() or self._outgoing:
                try:
                    if dict(poller.poll(20)):
                        self._receive_all()
                    if self._answering:
                        self._poll_answers(time.monotonic())
                    self._send_outgoing()
                    if self._restate is not None and self.operations.due(time.monotonic()):
                        self._restate(self.operations.restatement())
                except zmq.ContextTerminated:
                    return
                except Exception as exc:  # never let the control thread die
                    self.faults.record(exc)
                if self._stop_event.is_set():
                    self._send_outgoing()
                    return
        finally:
            close_monitored(self._socket)

    def _receive_all(self) -> None:
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, payload = frames[0], frames[-1]
            verdict = self.limiter.verdict(identity, time.monotonic())
            if verdict is Verdict.DROP:
                continue
            try:
                if verdict is Verdict.BUSY:
                    self._answer_busy(identity, payload)
                    continue
                self._handle(identity, payload)
            except Exception as exc:  # no input may end the control thread: count it, answer, go on
                self.faults.record(exc)
                self._answer_internal_error(identity, payload, exc)

    def _answer_internal_error(self, identity: bytes, payload: bytes, exc: Exception) -> None:
        bad = Command(id=_command_id(payload), cmd="")
        self._identities[bad.id] = identity
        self.reply(bad, "error", error=f"the control server could not handle this command ({type(exc).__name__}); "
                                       "the run goes on", code="internal")

    def _answer_busy(self, identity: bytes, payload: bytes) -> None:
        bad = Command(id=_command_id(payload), cmd="")
        self._identities[bad.id] = identity
        self.reply(bad, "error", error=f"too many commands: at most {self.limiter.burst} at once and "
                                       f"{self.limiter.rate_per_s:g} a second; the next ones are ignored for "
                                       f"{self.limiter.burst / self.limiter.rate_per_s:g} s", code="busy")

    def _handle(self, identity: bytes, payload: bytes) -> None:
        try:
            msg = decode(payload)
            if not isinstance(msg, Command):
                raise ProtocolError(f"expected a 'command' message on the control channel, got {type(msg).__name__}")
            args = validate_command(msg)
        except ProtocolError as exc:
            self.rejected += 1
            bad = Command(id=_command_id(payload), cmd="")
            self._identities[bad.id] = identity
            self.reply(bad, "error", error=exc.message, code=exc.code)
            return
        self._identities[msg.id] = identity
        if msg.cmd in IMMEDIATE_COMMANDS:
            self._answer_now(msg, args)
            return
        try:
            self._pending.put_nowait(PendingCommand(msg, args, identity))
        except queue.Full:
            self.reply(msg, "error", error=f"{MAX_PENDING_COMMANDS} commands are already waiting; try again",
                       code="busy")
            return
        self.reply(msg, "ack", result={"applies_at": "the step boundary after next", "args": dict(msg.args)})
        if msg.cmd == "stop" and self._on_stop is not None:
            self._on_stop(args.reason)

    def _answer_now(self, msg: Command, args: Any) -> None:
        handler = self._immediate.get(msg.cmd)
        if handler is None:
            if msg.cmd != "status":
                self.reply(msg, "error", error=f"{msg.cmd!r} is not available in this run", code="unavailable")
                return
            self.reply(msg, "done", result=self._snapshot())
            return
        try:
            answer = handler(msg, args)
        except Exception as exc:  # a failed answer is this command's error, not the thread's end
            self.reply(msg, "error", error=f"{type(exc).__name__}: {exc}", code="failed")
            return
        if callable(answer):
            self._answering.append((msg, answer))
        else:
            self.reply(msg, "done", result=answer)

    def _poll_answers(self, now: float) -> None:
        waiting = []
        for msg, poll in self._answering:
            try:
                result = poll(now)
            except Exception as exc:
                self.reply(msg, "error", error=f"{type(exc).__name__}: {exc}", code="failed")
                continue
            if result is None:
                waiting.append((msg, poll))
            else:
                self.reply(msg, "done", result=result)
        self._answering = waiting

    def _send_outgoing(self) -> None:
        while self._outgoing:
            identity, msg = self._outgoing.popleft()
            msg.rank, msg.seq, msg.ts = 0, next(self._seq), time.time()
            try:
                frame = encode(msg)
            except Exception as exc:  # a result that does not encode: say so instead of dying
                self.faults.record(exc)
                msg = Reply(id=msg.id, status="error", cmd=msg.cmd, error=f"the reply could not be encoded: {exc}",
                            code="internal", rank=0, seq=msg.seq, ts=msg.ts)
                frame = encode(msg)
            if identity is not None:
                try:
                    self._socket.send_multipart([identity, frame], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            self.operations.record(msg, len(frame))
            self._publish_reply(msgspec.structs.replace(msg))


def _command_id(payload: bytes) -> str:
    """Best effort: echo the id of a command that failed validation so the client can match it
    (not of an oversize one: it is not decoded at all)."""
    if len(payload) > MAX_FRAME_BYTES:
        return ""
    try:
        raw = msgspec.msgpack.decode(payload)
        if isinstance(raw, dict) and isinstance(raw.get("id"), str):
            return raw["id"][:MAX_ID_CHARS]
    except Exception:
        pass
    return ""


_commands_decoder = msgspec.msgpack.Decoder(list[Command])


def broadcast_bytes(payload: bytes, rank: int, group: dist.ProcessGroup) -> bytes:
    """Rank 0's `payload` on every rank; one length broadcast, plus one for the bytes if any."""
    length = torch.tensor([len(payload) if rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(length, src=0, group=group)
    return broadcast_payload(payload, int(length[0]), rank, group)


def scatter_fixed(payloads: list[bytes], n: int, rank: int, group: dist.ProcessGroup) -> bytes:
    """Rank 0's `payloads[r]` (each exactly `n` bytes) on rank r, and on no other rank."""
    out = torch.empty(n, dtype=torch.uint8)
    chunks = None
    if rank == 0:
        if any(len(p) != n for p in payloads):
            raise ValueError(f"every payload must be {n} bytes")
        chunks = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads]
    dist.scatter(out, chunks, src=0, group=group)
    return out.numpy().tobytes()


def all_gather_fixed(payload: bytes, n: int, world_size: int, group: dist.ProcessGroup) -> list[bytes]:
    """Every rank's `payload` (at most `n` bytes, zero-padded) on every rank, in rank order."""
    if len(payload) > n:
        raise ValueError(f"a payload must be at most {n} bytes")
    mine = torch.frombuffer(bytearray(payload.ljust(n, b"\0")), dtype=torch.uint8)
    everyone = [torch.empty(n, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(everyone, mine, group=group)
    return [t.numpy().tobytes().rstrip(b"\0") for t in everyone]


def broadcast_payload(payload: bytes, n: int, rank: int, group: dist.ProcessGroup) -> bytes:
    """Rank 0's `payload` of `n` bytes (a length every rank already knows) on every rank."""
    if n == 0:
        return b""
    if rank == 0:
        dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0, group=group)
        return payload
    buffer = torch.empty(n, dtype=torch.uint8)
    dist.broadcast(buffer, src=0, group=group)
    return buffer.numpy().tobytes()


class StepSync:
    """Every rank calls `commands_for_step` at the same step boundary and gets the same commands.

    Pipelined so that agreeing costs no step any waiting: at each boundary rank 0 takes the
    commands that have arrived and starts an asynchronous broadcast of their size; the next
    boundary completes it (by then long done, while the step computed) and hands out those
    commands, sending their bytes only when there are any. A command thus applies one step after it
    arrives. A blocking broadcast at every boundary instead made each step wait for the slowest
    rank there and cost the 1m model 3% of its step time."""

    def __init__(self, rank: int, server: ControlServer | None, group: dist.ProcessGroup | None):
        self._rank = rank
        self._server = server
        self._group = group
        self._announced: tuple[Any, torch.Tensor, list[PendingCommand], bytes] | None = None

    def _take(self) -> list[PendingCommand]:
        return self._server.take_pending() if (self._rank == 0 and self._server) else []

    def _announce(self) -> None:
        taken = self._take()
        payload = msgspec.msgpack.encode([p.command for p in taken]) if taken else b""
        length = torch.tensor([len(payload)], dtype=torch.int64)
        work = dist.broadcast(length, src=0, group=self._group, async_op=True)
        self._announced = (work, length, taken, payload)

    def commands_for_step(self) -> list[PendingCommand]:
        if self._group is None:
            return self._take()
        if self._announced is None:
            self._announce()
        work, length, taken, payload = self._announced
        work.wait()
        self._announced = None
        received = broadcast_payload(payload, int(length[0]), self._rank, self._group)
        if self._rank != 0 and received:
            taken = [PendingCommand(c, validate_command(c)) for c in _commands_decoder.decode(received)]
        self._announce()
        return taken

    def close(self) -> None:
        """At the end of the loop (same point on every rank): finish the outstanding broadcast and
        tell the senders of commands taken but never applied."""
        if self._announced is None:
            return
        work, _, taken, _ = self._announced
        self._announced = None
        work.wait()
        if self._server is not None:
            for pending in taken:
                self._server.reply(pending.command, "error", error="the run ended before this command was applied",
                                   code="ended")
