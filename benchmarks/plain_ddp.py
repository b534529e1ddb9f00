"""A plain hand-written DDP loop: the baseline the agent is measured against.

Same model, data, batch and optimizer as `ringtop.agent` with --strategy ddp; none of its
instruments. Run under torchrun; rank 0 writes the wall time at the end of every step.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ringtop.agent.models.data import global_batch
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=128)
parser.add_argument("--model-size", default="1m")
parser.add_argument("--out", required=True)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DistributedDataParallel(build_tiny_gpt(args.model_size, 0))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
vocab = MODEL_SIZES[args.model_size].vocab_size
ends = []
for step in range(args.steps):
    inputs, targets = global_batch(step, rank, world, args.batch_size, args.seq_len, vocab, 0)
    optimizer.zero_grad(set_to_none=True)
    loss = model(inputs, targets)
    loss.backward()
    optimizer.step()
    loss.item()
    ends.append(time.time())
if rank == 0:
    with open(args.out, "w") as f:
        json.dump(ends, f)
dist.destroy_process_group()
