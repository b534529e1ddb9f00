"""`ringtop simulate`: a run of N ranks without a cluster, for trying and benchmarking the UI at scale.

Everything a UI sees goes the real way: the run's keys (`curve.generate(N)`), the `Gatekeeper`,
rank 0's real `Relay` (with the real hang watch as its observer) and a real `ControlServer`
answering `status`, and the connection file written as the runner writes it, so `ringtop ui` and
`ringtop ctl` attach with no arguments. Only the ranks are simulated: each is one XPUB socket in
this process, connected to the relay with *that rank's own* CURVE key pair. The relay names each
input connection after the key's rank (ZAP user id) and drops a message whose rank is not its
sender's, so a shared connection carrying several ranks could not pass honestly: N ranks are N
sockets (the context's socket limit is raised; 4096 ranks need about 3 file descriptors each).

Steps of all ranks advance together on one global step clock at `--hz` (as data-parallel ranks
do), so a UI's lag behind the newest step can be measured; a rank's reported step time is a base
of 70 % of the period with 3 % noise (`--straggler R`: 1.3x that on rank R). Noise comes from a
table drawn once from `--seed`, indexed by (rank, step), so the messages do not depend on timing.

One process holds the relay and all N ranks (one GIL): at thousands of ranks on a small machine
the simulator and its relay, not the UI, may set the pace. The step rate reached, the messages
sent and what the relay forwarded are in `--status-file` and the closing line; a simulator that
falls behind publishes every step late rather than skipping any.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import zmq

from ringtop.protocol import (
    Bye,
    CommStat,
    Event,
    GpuSample,
    GroupCursor,
    Heartbeat,
    Hello,
    InFlight,
    MemorySample,
    Sample,
    Sharding,
    Stall,
    Step,
    connection_file,
    curve,
    encode,
)

VERSION = "0.1.0"
BASE_FRACTION = 0.7
"""A rank's step takes this share of the step period: a 1.3x straggler still fits in it."""
STRAGGLER_FACTOR = 1.3
NOISE = 0.03
"""Relative standard deviation of a step's time."""
HANG_AFTER_S = 3.0
"""--hang: every rank stops stepping after this long."""
STALL_THRESHOLD_S = 2.0
"""--hang: the stall reports start this long after the last step, then repeat every STALL_EVERY_S."""
STALL_EVERY_S = 2.0
MAX_HZ = 1000.0
PARAMS = 1_300_000_000
BATCH, SEQ_LEN = 8, 2048
DEVICE_MEM = 80 * 1024**3
DIGEST = "5eed0001"
SUBSCRIBE_WAIT_S = 60.0
CONNECT_BATCH = 256
"""Ranks connected at once: 4096 CURVE handshakes at once on a loaded machine timed some out
(the gatekeeper counted ~100 refusals, which the UI then shows as an attack)."""
DRAIN_S = 30.0
"""At the end, how long the relay may take to forward what the ranks sent (a backlog at scale)."""


class SimulateError(ValueError):
    """Arguments that describe no run; the message says which and why."""


@dataclass
class SimConfig:
    ranks: int = 8
    nodes: int = 1
    hz: float = 10.0
    straggler: int | None = None
    hang: int | None = None
    seconds: float = 0.0
    """0: until stopped (Ctrl-C)."""
    seed: int = 0
    run_id: str = ""
    status_file: str | None = None
    relay: str = ""
    publish: str = ""
    control: str = ""
    """Where rank 0's relay input, telemetry and control bind; empty: the defaults, each moved to
    a free port when taken (as `ringtop run` does)."""

    def validate(self) -> None:
        if self.ranks < 1:
            raise SimulateError(f"--ranks must be >= 1 (got {self.ranks})")
        if self.nodes < 1 or self.nodes > self.ranks:
            raise SimulateError(f"--nodes must be between 1 and --ranks ({self.ranks}) (got {self.nodes})")
        if not (self.hz > 0 and self.hz <= MAX_HZ) or not math.isfinite(self.hz):
            raise SimulateError(f"--hz must be > 0 and <= {MAX_HZ:g} (got {self.hz:g})")
        for flag, rank in (("--straggler", self.straggler), ("--hang", self.hang)):
            if rank is not None and not 0 <= rank < self.ranks:
                raise SimulateError(f"{flag}: rank {rank} is not in this run of {self.ranks} ranks "
                                    f"(0-{self.ranks - 1})")
        if self.seconds < 0 or not math.isfinite(self.seconds):
            raise SimulateError(f"--seconds must be >= 0 (got {self.seconds:g})")


@dataclass
class SimResult:
    run_id: str
    steps: int
    """The last step published."""
    sent: int
    """Messages the simulated ranks handed to their sockets."""
    send_drops: int
    """Messages a rank's full socket refused (counted in its `drops`)."""
    forwarded: int
    """Messages rank 0's relay forwarded."""
    dropped: int
    """Messages rank 0's relay refused (not real: 0 in a correct simulation)."""
    seconds: float
    refused: int


def placement(ranks: int, nodes: int) -> list[tuple[str, int]]:
    """(host, local rank) of each rank: contiguous blocks, as a launcher places them."""
    out = []
    for node in range(nodes):
        first, end = node * ranks // nodes, (node + 1) * ranks // nodes
        out += [(f"node-{node:03d}", r - first) for r in range(first, end)]
    return out


class _Noise:
    """Gaussian noise by (rank, step, salt) from a fixed table: deterministic for a seed."""

    SIZE = 1 << 16

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self._table = [rng.gauss(0.0, 1.0) for _ in range(self.SIZE)]

    def __call__(self, rank: int, step: int, salt: int = 0) -> float:
        return self._table[(rank * 7919 + step * 104_729 + salt * 15_485_863) % self.SIZE]


class Simulation:
    """One simulated run; `run()` does everything on the calling thread, which owns the ranks'
    sockets, until `stop` is set or `--seconds` have passed, and ends with every rank's Bye."""

    def __init__(self, cfg: SimConfig, stop: threading.Event | None = None,
                 on_ready: Callable[[connection_file.ConnectionInfo], None] | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.on_ready = on_ready
        self.run_id = cfg.run_id or f"sim{random.Random().getrandbits(24):06x}"
        self.hosts = placement(cfg.ranks, cfg.nodes)
        self.noise = _Noise(cfg.seed)
        self.step = 0
        self.last_loss = float("nan")
        self.last_step_ms = 0.0
        self.hung_at: float | None = None
        self.relay = self.control = self.gate = None
        self.connection_path: Path | None = None
        self._rank0_out: deque[Any] = deque()
        """Rank 0's own messages from other threads (control replies, the hang watch's events)."""
        self.sent = 0
        self.send_drops = 0
        self._drops = [0] * cfg.ranks
        self._seq = [0] * cfg.ranks
        self._topics = [{t: f"{t}.{r}".encode() for t in ("hello", "step", "sample", "heartbeat", "event",
                                                           "stall", "bye", "reply")} for r in range(cfg.ranks)]

    # ------------------------------------------------------------------ rank 0's side

    def _start_rank0(self, keys: curve.RunKeys) -> None:
        from ringtop.agent.control import ControlServer  # torch: only the simulator pays for it
        from ringtop.agent.gatekeeper import Gatekeeper
        from ringtop.agent.hang_watch import HangWatch
        from ringtop.agent.relay import Relay
        from ringtop.protocol import DEFAULT_CONTROL_ADDRESS, DEFAULT_PUBLISH_ADDRESS, DEFAULT_RELAY_ADDRESS

        self.gate = Gatekeeper(keys, on_refusal=lambda text, n: self._rank0_event("warn", "auth", text,
                                                                                  {"refused": n}))
        self.hang_watch = HangWatch(self.cfg.ranks, self._rank0_event)
        cfg = self.cfg
        self.relay = Relay(cfg.relay or DEFAULT_RELAY_ADDRESS, cfg.publish or DEFAULT_PUBLISH_ADDRESS,
                           run_id=self.run_id, world_size=cfg.ranks, gate=self.gate,
                           movable=[name for name in ("relay", "publish") if not getattr(cfg, name)],
                           observers=[self.hang_watch.observe])
        self.control = ControlServer(cfg.control or DEFAULT_CONTROL_ADDRESS, self._snapshot, self._rank0_out.append,
                                     gate=self.gate, movable=not cfg.control, immediate={"stacks": self._not_simulated,
                                                              "dump": self._not_simulated})
        self.gate.start()
        self.relay.start()
        self.control.start()

    def _rank0_event(self, level: str, kind: str, text: str, data: dict[str, Any]) -> None:
        """From the relay's or gatekeeper's thread: sent by rank 0 on the publishing thread."""
        self._rank0_out.append(Event(level=level, kind=kind, text=text, step=self.step, data=data))

    @staticmethod
    def _not_simulated(command, args):
        raise RuntimeError(f"a simulated run: {command.cmd!r} is not available (only status is answered)")

    def _snapshot(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "steps": self._total_steps(), "strategy": "ddp",
                "world_size": self.cfg.ranks, "loss": self.last_loss, "step_ms": self.last_step_ms,
                "last_checkpoint": "", "refused_connections": self.gate.refused if self.gate else 0,
                "simulated": True}

    def _answer_queued_commands(self) -> None:
        for pending in self.control.take_pending():
            self.control.reply(pending.command, "error", error="a simulated run: only status is answered",
                               code="failed")

    def _total_steps(self) -> int:
        return int(self.cfg.seconds * self.cfg.hz) if self.cfg.seconds and self.cfg.hang is None else 0

    def _write_connection_file(self, keys: curve.RunKeys) -> None:
        info = connection_file.ConnectionInfo(
            run_id=self.run_id, pid=os.getpid(), host=socket.gethostname(), publish=self.relay.publish_address,
            control=self.control.address, relay=self.relay.relay_address, world_size=self.cfg.ranks,
            started_ts=time.time(), log_dir="", checkpoint_dir="", keys=keys.client)
        self.connection_path = connection_file.write(info)
        if self.on_ready is not None:
            self.on_ready(info)

    # ------------------------------------------------------------------ the ranks

    def _send(self, sock: zmq.Socket, rank: int, msg: Any) -> None:
        msg.rank, msg.seq, msg.ts = rank, self._seq[rank], time.time()
        self._seq[rank] += 1
        try:
            sock.send_multipart([self._topics[rank][msg.__struct_config__.tag], encode(msg)], zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self._drops[rank] += 1
            self.send_drops += 1

    def _hello(self, rank: int, started: float) -> Hello:
        host, local = self.hosts[rank]
        return Hello(run_id=self.run_id, world_size=self.cfg.ranks, local_rank=local, host=host, pid=100_000 + rank,
                     backend="nccl", device=f"cuda:{local % 8}", strategy="ddp", strategy_options={},
                     sharding=Sharding(), dtype="bf16", optimizer_bytes_per_param=12, model="simulated-gpt-1.3b",
                     param_count=PARAMS, torch_version="simulated", ringtop_version=VERSION, batch_size=BATCH,
                     seq_len=SEQ_LEN, steps=self._total_steps(), lr=3e-4, seed=self.cfg.seed,
                     device_mem_total_bytes=DEVICE_MEM, process_started_ts=started,
                     publish=self.relay.publish_address, control=self.control.address)

    def step_ms(self, rank: int, step: int) -> float:
        """The rule a straggler test checks: base x (1 + 3 % noise), 1.3x on the straggler."""
        base = BASE_FRACTION * 1e3 / self.cfg.hz * (STRAGGLER_FACTOR if rank == self.cfg.straggler else 1.0)
        return base * max(0.5, 1.0 + NOISE * self.noise(rank, step))

    def _step(self, rank: int, step: int) -> Step:
        n = self.noise
        ms = self.step_ms(rank, step)
        loss = 2.1 + 8.0 * math.exp(-step / 300.0) + 0.03 * n(rank, step, 1)
        state = PARAMS * 2 + PARAMS * 2 + PARAMS * 12
        allocated = state + int(14e9 * (1.0 + 0.01 * n(rank, step, 2)))
        mem = MemorySample(params_bytes=PARAMS * 2, grads_bytes=PARAMS * 2, optimizer_bytes=PARAMS * 12,
                           rss_bytes=6_000_000_000, cuda_allocated_bytes=allocated,
                           cuda_reserved_bytes=int(allocated * 1.08), cuda_peak_bytes=int(allocated * 1.15),
                           cuda_peak_reserved_bytes=int(allocated * 1.2))
        busy = 0.35 * ms
        comm = [CommStat(kind="all_reduce", count=1, bytes=PARAMS * 2, busy_ms=busy, group_size=self.cfg.ranks)]
        tokens = BATCH * SEQ_LEN
        return Step(step=step, loss=loss, step_ms=ms, grad_norm=0.8 + 3.0 * math.exp(-step / 150.0),
                    data_ms=0.02 * ms, forward_ms=0.3 * ms, backward_ms=0.5 * ms, optimizer_ms=0.1 * ms,
                    comm_blocked_ms=0.08 * ms, comm_busy_ms=busy, tokens=tokens, tokens_per_s=tokens / (ms / 1e3),
                    mem=mem, comm=comm, cpu_percent=100.0 + 5.0 * n(rank, step, 3), drops=self._drops[rank],
                    idle_ms=0.1 * ms,
                    collectives=[GroupCursor(group="world", issued=step, completed=step, count=1, digest=DIGEST)])

    def _sample(self, rank: int, tick: int) -> Sample:
        n = self.noise(rank, tick, 4)
        hung = self.hung_at is not None
        gpu = GpuSample(index=self.hosts[rank][1] % 8, name="NVIDIA H100 80GB HBM3",
                        util_percent=0.0 if hung else min(100.0, 92.0 + 3.0 * n),
                        mem_used_bytes=40_000_000_000, mem_total_bytes=DEVICE_MEM, power_w=120.0 if hung else 640.0,
                        temperature_c=62.0 + n, nvlink_tx_bytes_per_s=0.0 if hung else 1.2e11,
                        nvlink_rx_bytes_per_s=0.0 if hung else 1.2e11, nvlink_links=18, nvlink_version=4)
        return Sample(cpu_percent=100.0 + 5.0 * n, rss_bytes=6_000_000_000, gpu=gpu)

    def _stall(self, rank: int, now: float) -> Stall:
        """As metrics.hang reads a hang: all but the hung rank wait in the next all_reduce on world;
        the hung rank has not entered it (it is still in its forward)."""
        seq = self.step + 1
        waited = now - self.hung_at + 1.0 / self.cfg.hz
        if rank == self.cfg.hang:
            return Stall(step=seq, phase="forward", running_s=waited, threshold_s=STALL_THRESHOLD_S,
                         where="model.py:57 in forward",
                         stack=["train.py:210 in main", "train.py:142 in train_step", "model.py:57 in forward"],
                         groups=[GroupCursor(group="world", issued=seq - 1, completed=seq - 1)])
        return Stall(step=seq, phase="backward", running_s=waited, threshold_s=STALL_THRESHOLD_S,
                     where="train.py:150 in train_step",
                     stack=["train.py:210 in main", "train.py:150 in train_step"],
                     in_flight=[InFlight(group="world", seq=seq, kind="all_reduce", bytes=PARAMS * 2,
                                         shapes=DIGEST, age_s=waited)],
                     groups=[GroupCursor(group="world", issued=seq, completed=seq - 1)])

    def _connect(self, ctx: zmq.Context, keys: curve.RunKeys, ranks: range) -> list[zmq.Socket]:
        socks = []
        for rank in ranks:
            sock = ctx.socket(zmq.XPUB)
            sock.setsockopt(zmq.SNDHWM, 4096)
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue refuses the send: counted in the rank's drops
            sock.setsockopt(zmq.LINGER, 0)
            curve.secure_client(sock, keys.for_rank(rank))
            sock.connect(self.relay.relay_address)
            socks.append(sock)
        return socks

    def _await_subscriptions(self, socks: list[zmq.Socket]) -> None:
        """An XPUB drops what it sends before the relay's subscription arrives (telemetry.py)."""
        waiting = set(range(len(socks)))
        deadline = time.monotonic() + SUBSCRIBE_WAIT_S
        while waiting and time.monotonic() < deadline and not self.stop.is_set():
            for rank in list(waiting):
                try:
                    while True:
                        if socks[rank].recv(zmq.NOBLOCK)[:1] == b"\x01":
                            waiting.discard(rank)
                            break
                except zmq.Again:
                    pass
            if waiting:
                time.sleep(0.01)
        if waiting and not self.stop.is_set():
            print(f"ringtop simulate: {len(waiting)} ranks never got the relay's subscription", file=sys.stderr)

    def _flush_rank0(self, sock: zmq.Socket) -> None:
        while self._rank0_out:
            self._send(sock, 0, self._rank0_out.popleft())

    def _status(self, started: float, final: bool = False) -> None:
        if not self.cfg.status_file:
            return
        status = {"run_id": self.run_id, "step": self.step, "ts": time.time(), "elapsed_s": time.monotonic() - started,
                  "sent": self.sent, "send_drops": self.send_drops, "forwarded": self.relay.forwarded,
                  "dropped": self.relay.dropped, "final": final}
        tmp = f"{self.cfg.status_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, self.cfg.status_file)

    def run(self) -> SimResult:
        cfg = self.cfg
        _raise_fd_limit(cfg.ranks * 4 + 256)
        keys = curve.generate(cfg.ranks)
        ctx = zmq.Context(io_threads=2)
        ctx.set(zmq.MAX_SOCKETS, cfg.ranks + 64)
        socks: list[zmq.Socket] = []
        started = time.monotonic()
        try:
            self._start_rank0(keys)
            self._write_connection_file(keys)
            for first in range(0, cfg.ranks, CONNECT_BATCH):  # a few hundred handshakes at a time
                if self.stop.is_set():
                    break
                batch = self._connect(ctx, keys, range(first, min(cfg.ranks, first + CONNECT_BATCH)))
                socks += batch
                self._await_subscriptions(batch)
            if not self.stop.is_set():  # else stopped while connecting: no rank has said anything yet
                process_started = time.time()
                for rank, sock in enumerate(socks):
                    self._send(sock, rank, self._hello(rank, process_started))
                self._loop(socks, started)
                self._flush_rank0(socks[0])  # before rank 0's Bye: a Bye is a rank's last message
                for rank, sock in enumerate(socks):
                    self._send(sock, rank, Bye(reason="the simulation ended", step=self.step, ok=True))
                self._await_forwarded()
            self._status(started, final=True)
            return SimResult(run_id=self.run_id, steps=self.step, sent=self.sent, send_drops=self.send_drops,
                             forwarded=self.relay.forwarded, dropped=self.relay.dropped,
                             seconds=time.monotonic() - started, refused=self.gate.refused)
        finally:
            if self.connection_path is not None:
                connection_file.remove(self.connection_path)
            for sock in socks:
                sock.close(0)
            ctx.term()
            if self.control is not None:
                self.control.stop()
            if self.relay is not None:
                self.relay.stop(DRAIN_S)  # it ends once nothing is left to forward
            if self.gate is not None and not (self.relay is not None and self.relay.is_alive()):
                self.gate.stop()  # ends the servers' context: never under a relay still running

    def _await_forwarded(self, timeout_s: float = DRAIN_S) -> None:
        """The Byes through the relay before the sockets close (they are the ranks' last word)."""
        deadline = time.monotonic() + timeout_s
        seen, progress_at = -1, time.monotonic()
        while self.relay.forwarded + self.relay.dropped < self.sent and time.monotonic() < deadline:
            if self.relay.forwarded != seen:
                seen, progress_at = self.relay.forwarded, time.monotonic()
            elif time.monotonic() - progress_at > 2.0:
                return  # nothing moves: what is missing was lost on the way, waiting will not bring it
            time.sleep(0.02)

    def _loop(self, socks: list[zmq.Socket], started: float) -> None:
        """Slices of min(0.1 s, one step): each slice a tenth of the ranks send their heartbeat and
        sample (so each rank sends them once a second, spread evenly); a step is published for
        every rank when the global clock reaches it. A simulator that falls more than a second
        behind (too many ranks for this machine) goes on from where it is, without skipping steps."""
        cfg = self.cfg
        slice_s = min(0.1, 1.0 / cfg.hz)
        slices_per_s = max(1, round(1.0 / slice_s))
        t0 = time.monotonic()
        next_step_at = t0 + 1.0 / cfg.hz
        next_slice_at = t0 + slice_s
        tick = 0
        next_stall = None
        end = t0 + cfg.seconds + 0.5 / cfg.hz if cfg.seconds else math.inf  # the last step is due at S
        while not self.stop.is_set():
            now = time.monotonic()
            wake = min(next_step_at if self.hung_at is None else math.inf, next_slice_at, end)
            if wake > now:
                if self.stop.wait(wake - now):
                    break
                now = time.monotonic()
            if now >= end:
                break
            self._answer_queued_commands()
            self._flush_rank0(socks[0])
            if self.hung_at is None and now >= next_step_at:
                if cfg.hang is not None and now - t0 >= HANG_AFTER_S:
                    self.hung_at = now
                    next_stall = now + STALL_THRESHOLD_S
                else:
                    step = self.step + 1
                    for rank, sock in enumerate(socks):
                        self._send(sock, rank, self._step(rank, step))
                    self.step = step
                    self.last_step_ms = self.step_ms(0, step)
                    self.last_loss = 2.1 + 8.0 * math.exp(-step / 300.0)
                    next_step_at += 1.0 / cfg.hz
                    if time.monotonic() - next_step_at > 1.0:
                        next_step_at = time.monotonic()
                    self._status(started)
            if now >= next_slice_at:
                tick += 1
                part = tick % slices_per_s
                for rank in range(part, cfg.ranks, slices_per_s):
                    self._send(socks[rank], rank, Heartbeat(step=self.step, drops=self._drops[rank]))
                    self._send(socks[rank], rank, self._sample(rank, tick))
                next_slice_at += slice_s
                if time.monotonic() - next_slice_at > 1.0:
                    next_slice_at = time.monotonic()
                if self.hung_at is not None:
                    self._status(started)
            if next_stall is not None and now >= next_stall:
                for rank, sock in enumerate(socks):
                    self._send(sock, rank, self._stall(rank, now))
                next_stall += STALL_EVERY_S


def _raise_fd_limit(wanted: int) -> None:
    """Each rank's socket holds a TCP connection at both ends and a signalling descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks N (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=1, help="hosts node-000... the ranks are spread over "
                        "(default %(default)s)")
    parser.add_argument("--hz", type=float, default=10.0, help="steps per second, all ranks together "
                        "(default %(default)s)")
    parser.add_argument("--straggler", type=int, default=None, metavar="R", help="rank R's steps take 1.3x longer")
    parser.add_argument("--hang", type=int, default=None, metavar="R",
                        help=f"after {HANG_AFTER_S:g} s every rank stops stepping, rank R not having entered the "
                             "collective the others wait in (stall reports every 2 s)")
    parser.add_argument("--seconds", type=float, default=0.0, help="end after S seconds with every rank's Bye "
                        "(default 0: until Ctrl-C)")
    parser.add_argument("--seed", type=int, default=0, help="the noise's seed (default %(default)s)")
    parser.add_argument("--run-id", default="", help="the run's id (default: a random one)")
    parser.add_argument("--status-file", default=None, metavar="FILE",
                        help="rewrite FILE (JSON) at every step: step, messages sent, relay forwarded and dropped "
                             "(for benchmarks)")
    for flag, what in (("relay", "the ranks publish to"), ("publish", "UIs subscribe to"),
                       ("control", "UIs send commands to")):
        parser.add_argument(f"--{flag}", default="", metavar="ADDR",
                            help=f"the address {what} (default: the run's own default, a free port when taken)")


def config_from(args: argparse.Namespace) -> SimConfig:
    return SimConfig(ranks=args.ranks, nodes=args.nodes, hz=args.hz, straggler=args.straggler, hang=args.hang,
                     seconds=args.seconds, seed=args.seed, run_id=args.run_id, status_file=args.status_file,
                     relay=args.relay, publish=args.publish, control=args.control)


def main(args: argparse.Namespace) -> int:
    """The CLI: Ctrl-C (or SIGTERM) ends the run as --seconds does, with every rank's Bye."""
    cfg = config_from(args)
    try:
        cfg.validate()
    except SimulateError as exc:
        print(f"ringtop simulate: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def ready(info: connection_file.ConnectionInfo) -> None:
        print(f"ringtop simulate: run {info.run_id}, {cfg.ranks} ranks on {cfg.nodes} nodes at {cfg.hz:g} Hz; "
              f"telemetry {info.publish}, control {info.control}; attach with `ringtop ui`", file=sys.stderr,
              flush=True)

    try:
        result = Simulation(cfg, stop, on_ready=ready).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"ringtop simulate: ended at step {result.steps} after {result.seconds:.1f} s: {result.sent:,} messages "
          f"sent ({result.send_drops} refused by full sockets), relay forwarded {result.forwarded:,}, "
          f"dropped {result.dropped}", file=sys.stderr)
    return 0
