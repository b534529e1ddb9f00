"""A large run from fixed numbers, for the view model, the app and the screenshot: 8 nodes of 128
ranks stepping together (10 Hz-like: 100 ms steps), one straggler 30 % slower, and, on request, a
hung rank that the others wait for in an all-reduce (stall reports, as metrics/rules/hang.py reads them)."""

from __future__ import annotations

import hang_scenario as hs

from ringtop.protocol import CommStat, GroupCursor, Hello, MemorySample, Step

T0 = hs.T0
MiB = 2**20
NODES, PER_NODE = 8, 128
WORLD = NODES * PER_NODE
STRAGGLER = 517
"""On node-4 (ranks 512–639): 30 % slower than every other rank."""
HUNG = 700
"""On node-5: still in its forward while every other rank waits for it (`hung_reports`)."""


def host(rank: int) -> str:
    return f"node-{rank // PER_NODE}"


def hello(rank: int, world: int = WORLD) -> Hello:
    return Hello(rank=rank, seq=0, ts=T0 + rank * 1e-4, run_id="scale001", world_size=world, host=host(rank),
                 pid=10_000 + rank, local_rank=rank % PER_NODE, backend="gloo", device="cpu", strategy="ddp",
                 model="tiny-gpt", param_count=1_048_576, batch_size=8, seq_len=64, steps=1000)


def step(rank: int, n: int, seq: int, world: int = WORLD, straggler: int = STRAGGLER) -> Step:
    """Step `n` of `rank`: 100 ms with a fixed per-rank wobble of up to 0.6 ms, the straggler 130."""
    compute = 130.0 if rank == straggler else 100.0 + (rank % 7) * 0.1
    return Step(rank=rank, seq=seq, ts=T0 + 1 + n * 0.1 + rank * 1e-5, step=n, loss=round(3.0 - 0.01 * n, 4),
                step_ms=compute, data_ms=1.0, forward_ms=compute * 0.3, backward_ms=compute * 0.55,
                optimizer_ms=compute * 0.1, exposed_comm_ms=3.0, idle_ms=4.0, tokens=512,
                tokens_per_s=512 / compute * 1e3, mem=MemorySample(rss_bytes=(600 + rank % 3) * MiB),
                comm=[CommStat(kind="all_reduce", count=hs.PER_STEP, bytes=4 * MiB, busy_ms=5.0, group_size=world)],
                collectives=[GroupCursor(group="world", issued=n * hs.PER_STEP, completed=n * hs.PER_STEP,
                                         count=hs.PER_STEP, digest="abcd1234")],
                cpu_percent=95.0, grad_norm=1.0)


def run(steps: int = 12, world: int = WORLD, seq: hs.Seq | None = None) -> list:
    """Hellos, then `steps` steps of every rank, rank by rank within a step (as they arrive)."""
    seq = seq or hs.Seq()
    msgs: list = [hello(r, world) for r in range(world)]
    for n in range(1, steps + 1):
        msgs += [step(r, n, seq(r), world) for r in range(world)]
    return msgs


def hung_reports(seq: hs.Seq, steps: int = 12, world: int = WORLD, culprit: int = HUNG) -> list:
    """Every rank's stall report: the culprit in step `steps` + 1's forward, the others in its first all-reduce."""
    return [hs.stall(r, seq(r), culprit=culprit, done=steps) for r in range(world)]
