"""What each simulated rank says: its Hello, Steps, Samples and, in a hang, its Stalls. Pure:
the same (rank, step) gives the same message for a seed, whatever the timing."""

from __future__ import annotations

import math
import random

from ringtop.cli.simulate.config import SimConfig, placement
from ringtop.protocol import (
    CommStat,
    GpuSample,
    GroupCursor,
    Hello,
    InFlight,
    MemorySample,
    Sample,
    Sharding,
    Stall,
    Step,
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
PARAMS = 1_300_000_000
BATCH, SEQ_LEN = 8, 2048
DEVICE_MEM = 80 * 1024**3
DIGEST = "5eed0001"


class Noise:
    """Gaussian noise by (rank, step, salt) from a fixed table: deterministic for a seed."""

    SIZE = 1 << 16

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self._table = [rng.gauss(0.0, 1.0) for _ in range(self.SIZE)]

    def __call__(self, rank: int, step: int, salt: int = 0) -> float:
        return self._table[(rank * 7919 + step * 104_729 + salt * 15_485_863) % self.SIZE]


def mean_loss(step: int) -> float:
    """The loss curve every rank follows (each with its own noise)."""
    return 2.1 + 8.0 * math.exp(-step / 300.0)


class Scenario:
    """The messages of one simulated run: a 1.3B-parameter data-parallel job on H100s."""

    def __init__(self, cfg: SimConfig, run_id: str) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.hosts = placement(cfg.ranks, cfg.nodes)
        self.noise = Noise(cfg.seed)

    def total_steps(self) -> int:
        return int(self.cfg.seconds * self.cfg.hz) if self.cfg.seconds and self.cfg.hang is None else 0

    def hello(self, rank: int, started: float, publish: str = "", control: str = "") -> Hello:
        host, local = self.hosts[rank]
        return Hello(run_id=self.run_id, world_size=self.cfg.ranks, local_rank=local, host=host, pid=100_000 + rank,
                     backend="nccl", device=f"cuda:{local % 8}", strategy="ddp", strategy_options={},
                     sharding=Sharding(), dtype="bf16", optimizer_bytes_per_param=12, model="simulated-gpt-1.3b",
                     param_count=PARAMS, torch_version="simulated", ringtop_version=VERSION, batch_size=BATCH,
                     seq_len=SEQ_LEN, steps=self.total_steps(), lr=3e-4, seed=self.cfg.seed,
                     device_mem_total_bytes=DEVICE_MEM, process_started_ts=started, publish=publish, control=control)

    def step_ms(self, rank: int, step: int) -> float:
        """The rule a straggler test checks: base x (1 + 3 % noise), 1.3x on the straggler."""
        base = BASE_FRACTION * 1e3 / self.cfg.hz * (STRAGGLER_FACTOR if rank == self.cfg.straggler else 1.0)
        return base * max(0.5, 1.0 + NOISE * self.noise(rank, step))

    def step(self, rank: int, step: int, drops: int = 0) -> Step:
        n = self.noise
        ms = self.step_ms(rank, step)
        loss = mean_loss(step) + 0.03 * n(rank, step, 1)
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
                    exposed_comm_ms=0.08 * ms, comm_busy_ms=busy, tokens=tokens, tokens_per_s=tokens / (ms / 1e3),
                    mem=mem, comm=comm, cpu_percent=100.0 + 5.0 * n(rank, step, 3), drops=drops,
                    idle_ms=0.1 * ms,
                    collectives=[GroupCursor(group="world", issued=step, completed=step, count=1, digest=DIGEST)])

    def sample(self, rank: int, tick: int, hung: bool) -> Sample:
        n = self.noise(rank, tick, 4)
        gpu = GpuSample(index=self.hosts[rank][1] % 8, name="NVIDIA H100 80GB HBM3",
                        util_percent=0.0 if hung else min(100.0, 92.0 + 3.0 * n),
                        mem_used_bytes=40_000_000_000, mem_total_bytes=DEVICE_MEM, power_w=120.0 if hung else 640.0,
                        temperature_c=62.0 + n, nvlink_tx_bytes_per_s=0.0 if hung else 1.2e11,
                        nvlink_rx_bytes_per_s=0.0 if hung else 1.2e11, nvlink_links=18, nvlink_version=4)
        return Sample(cpu_percent=100.0 + 5.0 * n, rss_bytes=6_000_000_000, gpu=gpu)

    def stall(self, rank: int, last_step: int, waited_s: float) -> Stall:
        """As metrics.hang reads a hang: all but the hung rank wait in the next all_reduce on world;
        the hung rank has not entered it (it is still in its forward)."""
        seq = last_step + 1
        if rank == self.cfg.hang:
            return Stall(step=seq, phase="forward", running_s=waited_s, threshold_s=STALL_THRESHOLD_S,
                         where="model.py:57 in forward",
                         stack=["train.py:210 in main", "train.py:142 in train_step", "model.py:57 in forward"],
                         groups=[GroupCursor(group="world", issued=seq - 1, completed=seq - 1)])
        return Stall(step=seq, phase="backward", running_s=waited_s, threshold_s=STALL_THRESHOLD_S,
                     where="train.py:150 in train_step",
                     stack=["train.py:210 in main", "train.py:150 in train_step"],
                     in_flight=[InFlight(group="world", seq=seq, kind="all_reduce", bytes=PARAMS * 2,
                                         shapes=DIGEST, age_s=waited_s)],
                     groups=[GroupCursor(group="world", issued=seq, completed=seq - 1)])
