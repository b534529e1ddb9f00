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

With `--procs 1` (or `--nodes 1`) one process holds the relay and all N ranks, each straight
to the head relay (one GIL): at thousands of ranks on a small machine the simulator and its relay,
not the UI, set the pace. `--rank-procs K` moves ranks 1..N-1 to K worker processes, each rank
still straight to the head relay, which stays here with rank 0 (as real ranks are processes apart
from rank 0's relay). With `--nodes M --procs P` (P > 1; the default is 1 for now) the
run takes the real multi-node path and spreads over P processes: node 0's ranks stay in this one,
publishing to the head relay as node 0's ranks do in a real run, and nodes 1..M-1 go to P - 1
worker processes, each node with a real `NodeRelay` (its node key `RunKeys.for_node`, and the head
letting that key carry exactly that node's ranks) to which its ranks publish over loopback with
their own rank keys. A worker gets its keys and run id on its stdin (never in its argv or
environment, which other users of the node can read), reports its counters on its stdout, starts
stepping on the parent's word, on the same global step clock (a start time shared in wall-clock
time), and ends with its ranks' Byes on the parent's word; it dies with the parent
(PR_SET_PDEATHSIG) and its stdin's end stops it too.

The step rate reached, the messages sent (all processes), what the head relay forwarded and
dropped, and what the node relays lost are in `--status-file` and the closing line; a process
that falls behind the clock publishes its steps late rather than skipping any.
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
import subprocess
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
WORKER_READY_S = 300.0
"""How long a worker may take to start its node relays and connect its ranks (thousands of CURVE
handshakes on a loaded machine)."""
WORKER_EXIT_S = 15.0
REPORT_EVERY_S = 0.1
SWITCH_INTERVAL_S = 0.05
"""A worker's GIL hand-over interval (Python's default 5 ms): its node relays' and gatekeepers'
threads, hundreds at thousands of ranks, each forcing the publishing thread to yield at every
wake-up leave it a fraction of the CPU; they only move a few frames each time."""
"""A worker's counters reach the parent at most this often (and once at the end)."""



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
    procs: int | None = None
    """Processes the run spreads over, this one included: 1 holds every rank here, straight to the
    head relay; P > 1 puts nodes 1..M-1, each with its node relay, in P - 1 workers. None: 1 for
    now: on the 2-vCPU VM a worker's hundreds of node relay and gatekeeper threads (each relay its
    own) cost more than the processes gain (benchmarks/README.md, UI at scale)."""
    rank_procs: int = 0
    """K > 0: ranks 1..N-1 go to K worker processes, each rank straight to the head relay as in a
    one-node run, and this process keeps rank 0 with the head relay. In one process the ranks'
    sends and the relay's forwarding share one GIL, and at a thousand ranks the relay falls behind
    its ranks (benchmarks/README.md, UI at scale); real ranks are processes apart from it."""

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
        if self.procs is not None and not 1 <= self.procs <= self.nodes:
            raise SimulateError(f"--procs must be between 1 and --nodes ({self.nodes}): one process holds "
                                f"node 0, each other one at least a node (got {self.procs})")
        if not 0 <= self.rank_procs < self.ranks:
            raise SimulateError(f"--rank-procs must be between 0 and --ranks - 1 ({self.ranks - 1}): this process "
                                f"keeps rank 0, each worker at least a rank (got {self.rank_procs})")
        if self.rank_procs and (self.procs or 1) > 1:
            raise SimulateError("--rank-procs and --procs > 1 exclude each other: ranks apart publish straight "
                                "to the head relay, --procs puts nodes behind node relays")

    @property
    def processes(self) -> int:
        if self.rank_procs:
            return 1 + self.rank_procs
        return self.procs if self.procs is not None else 1

    @property
    def node_relays(self) -> bool:
        """Workers hold nodes behind their node relays (--procs P > 1), not ranks straight to the head."""
        return self.processes > 1 and not self.rank_procs


@dataclass
class SimResult:
    run_id: str
    steps: int
    """The last step published."""
    sent: int
    """Messages the simulated ranks handed to their sockets (all processes)."""
    send_drops: int
    """Messages a rank's full socket refused (counted in its `drops`)."""
    forwarded: int
    """Messages rank 0's relay forwarded."""
    dropped: int
    """Messages rank 0's relay refused (not real: 0 in a correct simulation)."""
    seconds: float
    refused: int
    lost: int = 0
    """Messages the node relays dropped from a full queue (0 unless the head fell far behind)."""
    gaps: int = 0
    """Messages the head relay found missing from a rank's `seq` (0 in a correct simulation)."""
    procs: int = 1


def placement(ranks: int, nodes: int) -> list[tuple[str, int]]:
    """(host, local rank) of each rank: contiguous blocks, as a launcher places them."""
    out = []
    for node in range(nodes):
        first, end = node * ranks // nodes, (node + 1) * ranks // nodes
        out += [(f"node-{node:03d}", r - first) for r in range(first, end)]
    return out


def node_ranks(ranks: int, nodes: int) -> list[range]:
    """Each node's ranks, as `placement` puts them."""
    return [range(node * ranks // nodes, (node + 1) * ranks // nodes) for node in range(nodes)]


def worker_shares(nodes: int, procs: int) -> list[list[int]]:
    """The nodes (or ranks) each of the procs - 1 workers holds: 1..nodes-1 in contiguous shares."""
    workers = procs - 1
    return [list(range(1 + w * (nodes - 1) // workers, 1 + (w + 1) * (nodes - 1) // workers))
            for w in range(workers)]


class _Noise:
    """Gaussian noise by (rank, step, salt) from a fixed table: deterministic for a seed."""

    SIZE = 1 << 16

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self._table = [rng.gauss(0.0, 1.0) for _ in range(self.SIZE)]

    def __call__(self, rank: int, step: int, salt: int = 0) -> float:
        return self._table[(rank * 7919 + step * 104_729 + salt * 15_485_863) % self.SIZE]


class Simulation:
    """One simulated run; `run()` does everything on the calling thread, which owns its ranks'
    sockets (and its workers), until `stop` is set or `--seconds` have passed, and ends with every
    rank's Bye."""

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
        self.publish_address = self.control_address = ""
        self.connection_path: Path | None = None
        self.workers: list[_WorkerProcess] = []
        self._t0 = 0.0
        """The global step clock's start, in this process's monotonic time: step k is due at t0 + k / hz."""
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
        from ringtop.agent.gatekeeper import Gatekeeper, node_user
        from ringtop.agent.hang_watch import HangWatch
        from ringtop.agent.node_relay import NodeLayout
        from ringtop.agent.relay import Relay
        from ringtop.protocol import DEFAULT_CONTROL_ADDRESS, DEFAULT_PUBLISH_ADDRESS, DEFAULT_RELAY_ADDRESS

        self.gate = Gatekeeper(keys, on_refusal=lambda text, n: self._rank0_event("warn", "auth", text,
                                                                                  {"refused": n}))
        self.hang_watch = HangWatch(self.cfg.ranks, self._rank0_event)
        cfg = self.cfg
        carriers = None
        if cfg.node_relays:  # node relay k carries node k + 1's ranks, as `ringtop run` lets it
            carriers = NodeLayout(tuple(tuple(r) for r in node_ranks(cfg.ranks, cfg.nodes))).carriers(node_user)
        self.relay = Relay(cfg.relay or DEFAULT_RELAY_ADDRESS, cfg.publish or DEFAULT_PUBLISH_ADDRESS,
                           run_id=self.run_id, world_size=cfg.ranks, gate=self.gate,
                           movable=[name for name in ("relay", "publish") if not getattr(cfg, name)],
                           observers=[self.hang_watch.observe], carriers=carriers)
        self.control = ControlServer(cfg.control or DEFAULT_CONTROL_ADDRESS, self._snapshot, self._rank0_out.append,
                                     gate=self.gate, movable=not cfg.control, immediate={"stacks": self._not_simulated,
                                                              "dump": self._not_simulated})
        self.publish_address, self.control_address = self.relay.publish_address, self.control.address
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
                     publish=self.publish_address, control=self.control_address)

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

    def _connect(self, ctx: zmq.Context, ranks: range | list[int],
                 where: Callable[[int], tuple[str, curve.ClientKeys]]) -> list[zmq.Socket]:
        """`where(rank)`: the address the rank publishes to and its keys (its own pair)."""
        socks = []
        for rank in ranks:
            address, keys = where(rank)
            sock = ctx.socket(zmq.XPUB)
            sock.setsockopt(zmq.SNDHWM, 4096)
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue refuses the send: counted in the rank's drops
            sock.setsockopt(zmq.LINGER, 0)
            curve.secure_client(sock, keys)
            sock.connect(address)
            socks.append(sock)
        return socks

    def _connect_all(self, ctx: zmq.Context, ranks: list[int], where: Callable[[int], tuple[str, curve.ClientKeys]],
                     socks: dict[int, zmq.Socket]) -> None:
        """Into `socks` as they open (the caller closes them, also when this fails)."""
        for first in range(0, len(ranks), CONNECT_BATCH):  # a few hundred handshakes at a time
            if self.stop.is_set():
                break
            part = ranks[first:first + CONNECT_BATCH]
            batch = self._connect(ctx, part, where)
            socks.update(zip(part, batch))
            self._await_subscriptions(batch)

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


    def _flush_rank0(self, socks: dict[int, zmq.Socket]) -> None:
        if 0 in socks:
            while self._rank0_out:
                self._send(socks[0], 0, self._rank0_out.popleft())

    def _counts(self) -> dict[str, int]:
        """This process's ranks' counters plus the workers' latest."""
        out = {"sent": self.sent, "send_drops": self.send_drops, "lost": 0}
        for worker in self.workers:
            for key in out:
                out[key] += worker.report.get(key, 0)
        return out

    def _slowest_step(self) -> int:
        return min([self.step] + [w.report.get("step", 0) for w in self.workers if w.started])

    def _status(self, started: float, final: bool = False) -> None:
        if not self.cfg.status_file:
            return
        status = {"run_id": self.run_id, "step": self.step, "ts": time.time(), "elapsed_s": time.monotonic() - started,
                  **self._counts(), "forwarded": self.relay.forwarded, "dropped": self.relay.dropped,
                  "gaps": self.relay.gaps, "slowest_step": self._slowest_step(), "procs": 1 + len(self.workers),
                  "final": final}
        tmp = f"{self.cfg.status_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, self.cfg.status_file)

    def _setup_of(self, keys: curve.RunKeys, share: list[int]) -> dict[str, Any]:
        """What the worker holding `share` (nodes, or with --rank-procs ranks) needs: its ranks' and
        nodes' keys only (on its stdin)."""
        if self.cfg.rank_procs:
            nodes, ranks = [], share
        else:
            nodes, ranks = share, [r for node in share for r in node_ranks(self.cfg.ranks, self.cfg.nodes)[node]]
        cfg = {k: v for k, v in vars(self.cfg).items() if k in ("ranks", "nodes", "hz", "straggler", "hang", "seconds",
                                                                "seed", "rank_procs")}
        return {"cfg": dict(cfg, run_id=self.run_id, procs=self.cfg.procs), "parent": os.getpid(),
                "relay": self.relay.relay_address, "publish": self.publish_address, "control": self.control_address,
                "server_public": keys.server_public, "nodes": nodes,
                "node_keys": {n: [keys.node_public[n - 1], keys.node_secret[n - 1]] for n in nodes},
                "rank_keys": {r: [keys.rank_public[r], keys.rank_secret[r]] for r in ranks}}

    def run(self) -> SimResult:
        cfg = self.cfg
        procs = cfg.processes
        if cfg.rank_procs:
            mine, shares = [0], worker_shares(cfg.ranks, procs)
        elif procs > 1:
            mine, shares = list(node_ranks(cfg.ranks, cfg.nodes)[0]), worker_shares(cfg.nodes, procs)
        else:
            mine, shares = list(range(cfg.ranks)), []
        _raise_fd_limit((cfg.ranks if cfg.rank_procs else len(mine)) * 4 + cfg.nodes * 2 + 256)
        keys = curve.generate(cfg.ranks, cfg.nodes - 1 if cfg.node_relays else 0)
        ctx = zmq.Context(io_threads=2)
        ctx.set(zmq.MAX_SOCKETS, len(mine) + 64)
        socks: dict[int, zmq.Socket] = {}
        started = time.monotonic()
        steps = 0
        try:
            self._start_rank0(keys)
            self._write_connection_file(keys)
            for share in shares:  # they connect theirs meanwhile
                self.workers.append(_WorkerProcess(len(self.workers) + 1, self._setup_of(keys, share)))
            head = self.relay.relay_address
            self._connect_all(ctx, mine, lambda rank: (head, keys.for_rank(rank)), socks)
            self._await_workers_ready()
            if not self.stop.is_set():  # else stopped while connecting: no rank has said anything yet
                process_started = time.time()
                t0_wall = process_started + 0.05  # every worker has it before step 1 is due
                for worker in self.workers:
                    worker.tell({"go": t0_wall, "started": process_started})
                self._t0 = time.monotonic() + (t0_wall - time.time())
                for rank, sock in socks.items():
                    self._send(sock, rank, self._hello(rank, process_started))
                self._loop(socks, started)
                for worker in self.workers:
                    worker.tell({"stop": self.step})  # each publishes up to this step (if behind), then its Byes
                self._flush_rank0(socks)  # before rank 0's Bye: a Bye is a rank's last message
                for rank, sock in socks.items():
                    self._send(sock, rank, Bye(reason="the simulation ended", step=self.step, ok=True))
                self._await_workers_final()
                steps = max([self.step] + [w.report.get("step", 0) for w in self.workers])
                self._await_forwarded()
            self._status(started, final=True)
            counts = self._counts()
            return SimResult(run_id=self.run_id, steps=steps, sent=counts["sent"], send_drops=counts["send_drops"],
                             forwarded=self.relay.forwarded, dropped=self.relay.dropped,
                             seconds=time.monotonic() - started, refused=self.gate.refused, lost=counts["lost"],
                             gaps=self.relay.gaps, procs=procs)
        finally:
            for worker in self.workers:
                worker.close()  # its stdin's end: it stops its node relays and exits
            for worker in self.workers:
                worker.wait_or_kill(WORKER_EXIT_S)
            if self.connection_path is not None:
                connection_file.remove(self.connection_path)
            for sock in socks.values():
                sock.close(0)
            ctx.term()
            if self.control is not None:
                self.control.stop()
            if self.relay is not None:
                self.relay.stop(DRAIN_S)  # it ends once nothing is left to forward
            if self.gate is not None and not (self.relay is not None and self.relay.is_alive()):
                self.gate.stop()  # ends the servers' context: never under a relay still running

    def _await_workers_ready(self) -> None:
        deadline = time.monotonic() + WORKER_READY_S
        for worker in self.workers:
            while not worker.ready.wait(0.05):
                if self.stop.is_set():
                    return
                if worker.proc.poll() is not None:
                    raise RuntimeError(f"simulator worker {worker.index} exited with {worker.proc.returncode} "
                                       "before its ranks were connected (its stderr says why)")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"simulator worker {worker.index} did not connect its ranks within "
                                       f"{WORKER_READY_S:g} s")

    def _await_workers_final(self) -> None:
        """Each worker's last counts: its ranks' Byes handed to its node relays, and forwarded by them."""
        deadline = time.monotonic() + DRAIN_S
        for worker in self.workers:
            while not worker.final.wait(0.05) and worker.proc.poll() is None and time.monotonic() < deadline:
                pass

    def _await_forwarded(self, timeout_s: float = DRAIN_S) -> None:
        """The Byes through the relay before the sockets close (they are the ranks' last word)."""
        deadline = time.monotonic() + timeout_s
        seen, progress_at = -1, time.monotonic()
        while True:
            counts = self._counts()
            if self.relay.forwarded + self.relay.dropped >= counts["sent"] - counts["lost"]:
                return
            if time.monotonic() >= deadline:
                return
            if self.relay.forwarded != seen:
                seen, progress_at = self.relay.forwarded, time.monotonic()
            elif time.monotonic() - progress_at > 2.0:
                return  # nothing moves: what is missing was lost on the way, waiting will not bring it
            time.sleep(0.02)

    def _final_step(self) -> int | None:
        """Where this process's stepping ends: None while it goes on. Here (rank 0's process) at
        once, when stopped or at --seconds; a worker at the step the parent tells it."""
        if self.stop.is_set() or (self.cfg.seconds and time.monotonic() >= self._end):
            return self.step
        return None

    def _after_step(self, started: float) -> None:
        self._status(started)

    def _between(self, socks: dict[int, zmq.Socket]) -> None:
        if self.control is not None:
            self._answer_queued_commands()
        self._flush_rank0(socks)

    def _loop(self, socks: dict[int, zmq.Socket], started: float) -> None:
        """On the global clock (step k due at t0 + k / hz, the same in every process): slices of
        min(0.1 s, one step), each slice a tenth of the ranks sending their heartbeat and sample
        (so each rank sends them once a second, spread evenly); a step is published for every rank
        here when it is due. A process behind the clock (too many ranks for this machine)
        publishes the steps it owes late, back to back, never skipping one; --hang stops every
        process at the same step."""
        cfg = self.cfg
        period = 1.0 / cfg.hz
        slice_s = min(0.1, period)
        slices_per_s = max(1, round(1.0 / slice_s))
        t0 = self._t0
        self._end = t0 + cfg.seconds + 0.5 * period if cfg.seconds else math.inf  # the last step is due at S
        last_step = math.floor(cfg.seconds * cfg.hz + 0.5) if cfg.seconds else math.inf
        """No process steps past it, one whose parent's word comes late included."""
        hang_step = math.ceil(HANG_AFTER_S * cfg.hz - 1e-9) if cfg.hang is not None else None
        """The first step not taken: the first due HANG_AFTER_S or more after the start."""
        parts = [[(r, sock) for r, sock in socks.items() if r % slices_per_s == part] for part in range(slices_per_s)]
        tick = 0
        next_stall = math.inf
        while True:
            if self.hung_at is None and hang_step is not None and self.step + 1 >= hang_step:
                self.hung_at = t0 + hang_step * period
                next_stall = self.hung_at + STALL_THRESHOLD_S
            final = self._final_step()
            if final is not None and (self.step >= min(final, last_step) or self.hung_at is not None):
                break
            done = self.hung_at is not None or self.step >= last_step
            next_step_at = math.inf if done else t0 + (self.step + 1) * period
            next_slice_at = t0 + (tick + 1) * slice_s
            now = time.monotonic()
            if final is None:
                wake = min(next_step_at, next_slice_at, next_stall, self._end)
                if wake > now:
                    self.stop.wait(wake - now)
                    continue
            self._between(socks)
            if not done and (now >= next_step_at or final is not None):
                step = self.step + 1
                for rank, sock in socks.items():
                    self._send(sock, rank, self._step(rank, step))
                self.step = step
                self.last_step_ms = self.step_ms(0, step)
                self.last_loss = 2.1 + 8.0 * math.exp(-step / 300.0)
                self._after_step(started)
            if now >= next_slice_at:
                tick = max(tick + 1, int((now - t0) / slice_s))  # heartbeats are not owed: none sent twice
                for rank, sock in parts[tick % slices_per_s]:
                    self._send(sock, rank, Heartbeat(step=self.step, drops=self._drops[rank]))
                    self._send(sock, rank, self._sample(rank, tick))
                if self.hung_at is not None:
                    self._after_step(started)
            if now >= next_stall:
                for rank, sock in socks.items():
                    self._send(sock, rank, self._stall(rank, now))
                next_stall += STALL_EVERY_S


class _WorkerProcess:
    """The parent's side of a worker: its setup (keys included) goes down its stdin, never in its
    argv or environment; its counters come back on its stdout, one JSON line each."""

    def __init__(self, index: int, setup: dict[str, Any]) -> None:
        from ringtop.agent.lifecycle import exit_with_parent

        self.index = index
        self.report: dict[str, Any] = {}
        self.ready = threading.Event()
        self.final = threading.Event()
        self.started = False
        self.proc = subprocess.Popen([sys.executable, "-c", "from ringtop.cli.simulate import worker_main; "
                                      "worker_main()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     preexec_fn=lambda: exit_with_parent(signal.SIGKILL))
        self._reader = threading.Thread(target=self._read, name=f"ringtop-sim-worker-{index}", daemon=True)
        self._reader.start()
        self.tell(setup)

    def tell(self, message: dict[str, Any]) -> None:
        if message.get("go") is not None:
            self.started = True
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it has ended: its exit status says so

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if report.get("ready"):
                self.ready.set()
            else:
                self.report = report
                if report.get("final"):
                    self.final.set()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def wait_or_kill(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)
        self.proc.stdout.close()


class _Worker(Simulation):
    """A worker process's side: its share of the nodes, each with a real NodeRelay to the head
    relay, and their ranks publishing to it over loopback with their own keys."""

    def __init__(self, setup: dict[str, Any], out) -> None:
        super().__init__(SimConfig(**setup["cfg"]))
        self.setup = setup
        self.out = out
        self.publish_address, self.control_address = setup["publish"], setup["control"]
        self.go = threading.Event()
        self.closed = threading.Event()
        self._go: dict[str, Any] = {}
        self._stop_at: int | None = None
        self.node_relays: list[Any] = []
        self._reported_at = 0.0

    def _listen(self, stdin) -> None:
        """The parent's word: go (the clock's start), stop (at which step); its end stops everything."""
        for line in stdin:
            message = json.loads(line)
            if "go" in message:
                self._go = message
                self.go.set()
            elif "stop" in message:
                self._stop_at = int(message["stop"])
                self.stop.set()
        self.closed.set()
        self.stop.set()

    def _final_step(self) -> int | None:
        if not self.stop.is_set():
            return None
        return self._stop_at if self._stop_at is not None else self.step

    def _after_step(self, started: float) -> None:
        if time.monotonic() - self._reported_at >= REPORT_EVERY_S:
            self._report()

    def _between(self, socks: dict[int, zmq.Socket]) -> None:
        pass

    def _report(self, **extra: Any) -> None:
        self._reported_at = time.monotonic()
        lost = sum(r.lost for r in self.node_relays)
        line = {"step": self.step, "sent": self.sent, "send_drops": self.send_drops, "lost": lost, **extra}
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    def run_worker(self, stdin) -> None:
        from ringtop.agent.node_relay import NodeRelay

        setup = self.setup
        ranks = sorted(int(r) for r in setup["rank_keys"])
        rank_keys = {int(r): pair for r, pair in setup["rank_keys"].items()}
        _raise_fd_limit(len(ranks) * 6 + len(setup["nodes"]) * 32 + 256)
        threading.Thread(target=self._listen, args=(stdin,), name="ringtop-sim-parent", daemon=True).start()
        ctx = zmq.Context(io_threads=2)
        ctx.set(zmq.MAX_SOCKETS, len(ranks) + 64)
        socks: dict[int, zmq.Socket] = {}
        where: dict[int, Any] = {}
        try:
            for node in setup["nodes"]:
                public, secret = setup["node_keys"][str(node)]
                members = list(node_ranks(self.cfg.ranks, self.cfg.nodes)[node])
                relay = NodeRelay(setup["relay"], curve.ClientKeys(server_public=setup["server_public"],
                                                                   client_public=public, client_secret=secret),
                                  members, {r: rank_keys[r][0] for r in members}, run_id=self.run_id,
                                  world_size=self.cfg.ranks)
                relay.start()
                self.node_relays.append(relay)
                where.update({r: relay for r in members})
            if self.cfg.rank_procs:  # straight to the head relay, each rank with its own keys
                def to(r):
                    public, secret = rank_keys[r]
                    return setup["relay"], curve.ClientKeys(server_public=setup["server_public"],
                                                            client_public=public, client_secret=secret)
            else:
                def to(r):
                    return where[r].address, where[r].client_keys(*rank_keys[r])
            self._connect_all(ctx, ranks, to, socks)
            deadline = time.monotonic() + SUBSCRIBE_WAIT_S
            while not all(r.head_up for r in self.node_relays) and not self.stop.is_set():
                if time.monotonic() > deadline:
                    raise RuntimeError("a node relay never reached the head relay")
                self.stop.wait(0.02)
            self.out.write(json.dumps({"ready": True}) + "\n")
            self.out.flush()
            while not self.go.wait(0.05):
                if self.stop.is_set():
                    return
            self._t0 = time.monotonic() + (self._go["go"] - time.time())
            for rank, sock in socks.items():
                self._send(sock, rank, self._hello(rank, self._go["started"]))
            self._loop(socks, time.monotonic())
            for rank, sock in socks.items():
                self._send(sock, rank, Bye(reason="the simulation ended", step=self.step, ok=True))
            self._await_taken()
            self._report(final=True)
            self.closed.wait(DRAIN_S + WORKER_EXIT_S)  # the parent closes once the head has them all
        finally:
            for sock in socks.values():
                sock.close(0)
            ctx.term()
            for relay in self.node_relays:
                relay.stop()

    def _await_taken(self) -> None:
        """Every message its ranks sent handed on by their node relays (the Byes last). Ranks
        straight to the head: their sockets stay open until the parent, which counts what the head
        forwarded, closes this worker's stdin."""
        if not self.node_relays:
            return
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and not self.closed.is_set():
            if sum(r.forwarded + r.dropped + r.lost for r in self.node_relays) >= self.sent:
                return
            time.sleep(0.01)


def worker_main() -> None:
    """A worker process (`_WorkerProcess` starts it): dies with its parent; Ctrl-C and SIGTERM are
    the parent's to handle (it tells the workers to end, with their ranks' Byes)."""
    from ringtop.agent.lifecycle import exit_with_parent

    exit_with_parent(signal.SIGKILL)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # only the reports go to the parent's pipe
    stdin = sys.stdin.buffer
    setup = json.loads(stdin.readline() or "null")
    if setup is None or os.getppid() != setup["parent"]:
        return  # the parent is gone already
    try:
        _Worker(setup, out).run_worker(stdin)
    except Exception as exc:
        print(f"ringtop simulate: worker of nodes {setup['nodes'][0]}-{setup['nodes'][-1]} failed: {exc}",
              file=sys.stderr)
        sys.exit(1)
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
    parser.add_argument("--procs", type=int, default=None, metavar="P",
                        help="processes the run spreads over, this one included: nodes 1..M-1, each with a real "
                             "node relay, go to P-1 workers (default 1: every rank in this process, straight to the "
                             "head relay)")
    parser.add_argument("--rank-procs", type=int, default=0, metavar="K",
                        help="ranks 1..N-1 in K worker processes, each rank straight to the head relay (which "
                             "stays here with rank 0); default 0: every rank in this process, sharing the relay's GIL")
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
                        help="rewrite FILE (JSON) at every step: step, messages sent (all processes), head relay "
                             "forwarded and dropped, node relays lost (for benchmarks)")
    for flag, what in (("relay", "the ranks publish to"), ("publish", "UIs subscribe to"),
                       ("control", "UIs send commands to")):
        parser.add_argument(f"--{flag}", default="", metavar="ADDR",
                            help=f"the address {what} (default: the run's own default, a free port when taken)")


def config_from(args: argparse.Namespace) -> SimConfig:
    return SimConfig(ranks=args.ranks, nodes=args.nodes, hz=args.hz, straggler=args.straggler, hang=args.hang,
                     seconds=args.seconds, seed=args.seed, run_id=args.run_id, status_file=args.status_file,
                     relay=args.relay, publish=args.publish, control=args.control, procs=args.procs,
                     rank_procs=args.rank_procs)


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
              f"{cfg.processes} processes; telemetry {info.publish}, control {info.control}; attach with "
              "`ringtop ui`", file=sys.stderr,
              flush=True)

    try:
        result = Simulation(cfg, stop, on_ready=ready).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"ringtop simulate: ended at step {result.steps} after {result.seconds:.1f} s: {result.sent:,} messages "
          f"sent ({result.send_drops} refused by full sockets), relay forwarded {result.forwarded:,}, "
          f"dropped {result.dropped}; node relays lost {result.lost}", file=sys.stderr)
    return 0
