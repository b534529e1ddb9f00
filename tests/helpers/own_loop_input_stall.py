"""A script's own DDP loop under ringtop.Monitor on 2 gloo ranks whose rank 1 sleeps in the data part
of every step (its loader is slow), giving its tokens and FLOPs per token and the norm its clipping
returns; rank 0 reports a loss 50 x too large at step SPIKE_STEP.
`own_loop_input_stall.py STEPS DATA_MS OUT` writes OUT/rank-R.json with the norms clip_grad_norm_
returned."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ringtop
from ringtop.protocol import free_tcp_ports

BATCH, FEATURES, FLOPS_PER_TOKEN = 16, 32, 6 * (32 * 64 + 64 + 64 * 4 + 4)
SPIKE_STEP = 45
"""Rank 0 reports 50 x its loss at this step (a loss spike on one rank)."""


def main() -> int:
    steps, data_ms, out = int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))
    mon = ringtop.Monitor(model, optimizer, run_id=os.environ["RINGTOP_TEST_RUN_ID"], log_dir=str(out / "logs"),
                          publish=publish, relay=relay, control=control, flops_per_token=FLOPS_PER_TOKEN)
    generator = torch.Generator().manual_seed(rank)
    norms = []
    for _ in range(steps):
        with mon.step(tokens=BATCH) as s:
            if rank == 1:
                time.sleep(data_ms / 1e3)  # the loader: rank 0 waits for it in the all-reduce
            x = torch.randn(BATCH, FEATURES, generator=generator)
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            s.grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            s.loss = loss * 50 if rank == 0 and len(norms) + 1 == SPIKE_STEP else loss  # what rank 0 reports
        norms.append(float(s.grad_norm))
    mon.close()
    (out / f"rank-{rank}.json").write_text(json.dumps({"norms": norms}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
