"""The simulated run's shape: its options and their checks, where each rank lives, what it ended with."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_HZ = 1000.0
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


def process_shares(cfg: SimConfig) -> tuple[list[int], list[list[int]]]:
    """(the ranks the parent process holds, each worker's share: nodes, or with --rank-procs ranks)."""
    if cfg.rank_procs:
        return [0], worker_shares(cfg.ranks, cfg.processes)
    if cfg.processes > 1:
        return list(node_ranks(cfg.ranks, cfg.nodes)[0]), worker_shares(cfg.nodes, cfg.processes)
    return list(range(cfg.ranks)), []
