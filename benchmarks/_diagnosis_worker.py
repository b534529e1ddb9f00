"""Under torchrun: the diagnosis exchange as it is (sketches + top-k) against the all-gather of
every rank's window it replaced, alternated; rank 0 writes the times (ms) and bytes to --out."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from ringtop.agent.health.diagnosis_exchange import FIELDS, Diagnostician
from ringtop.metrics.rules.diagnosis import RankWindow, RunContext, diagnose


def gather_all(d: Diagnostician, world_size: int) -> list:
    """The exchange before: every rank's medians gathered on every rank, the rules on rank 0."""
    local = torch.tensor([statistics.median(c) for c in zip(*d.history)], dtype=torch.float64)
    gathered = [torch.zeros_like(local) for _ in range(world_size)]
    dist.all_gather(gathered, local, group=d.group)
    if d.rank != 0:
        return []
    return diagnose([RankWindow(r, **dict(zip(FIELDS, t.tolist()))) for r, t in enumerate(gathered)], d.run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gloo")
    run = RunContext(strategy="ddp", world_size=world, param_count=1_000_000)
    d = Diagnostician(rank, world, group, run, lambda *e: None)
    for i in range(20):
        d.record(100.0 + rank + i % 3, 1.0, 10.0, 12.0, 4e6, 0.0, 0.0)
    times: dict[str, list[float]] = {"sketch": [], "gather": []}
    verdicts: dict[str, list] = {}
    for r in range(args.rounds + 1):
        for arm in (("sketch", "gather") if r % 2 == 0 else ("gather", "sketch")):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            found = d.run_rules() if arm == "sketch" else gather_all(d, world)
            dist.barrier(group=group)
            if r > 0:
                times[arm].append((time.perf_counter() - t0) * 1e3)
            verdicts[arm] = sorted((v.rule, v.rank) for v in found)
    if rank == 0:
        per_round_sketch = d.bytes_sent / (args.rounds + 1)
        json.dump({"world_size": world, "times": times, "verdicts": verdicts,
                   "sketch_bytes_sent_per_rank": per_round_sketch,
                   "gather_bytes_received_per_rank": world * len(FIELDS) * 8,
                   "gather_bytes_sent_per_rank": len(FIELDS) * 8}, open(args.out, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
