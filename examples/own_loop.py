"""Your own torchrun DDP training loop, watched by ringtop: four lines added to a plain loop.

    torchrun --nproc_per_node 2 examples/own_loop.py --steps 500
    ringtop                      # in another terminal: the UI attaches to the run

ringtop's own options (where it logs, its ports, its stall thresholds) go in the environment,
e.g. RINGTOP_ARGS="--log-dir runs/mine --print-every 50", or as keyword arguments of Monitor.
"""

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ringtop

VOCAB, SEQ_LEN, BATCH = 256, 32, 8


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, VOCAB))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens))


def batches(rank: int, data_ms: float):
    generator = torch.Generator().manual_seed(1000 + rank)
    while True:
        if data_ms:
            time.sleep(data_ms / 1000)  # a slow loader: ringtop names the input stall
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200, help="0: until stopped from ringtop")
    parser.add_argument("--data-ms", type=float, default=0.0, help="make each batch take this long to load")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs, with the model on its device
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = sum(p.numel() for p in model.parameters())

    mon = ringtop.Monitor(model, optimizer, tokens_per_step=BATCH * SEQ_LEN, flops_per_token=6 * params)  # 1

    @mon.on_checkpoint  # 2: the UI's `c` (or `ringtop ctl checkpoint`) runs it on every rank
    def save(directory: Path, step: int) -> None:
        if rank == 0:
            torch.save({"step": step, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                       directory / "state.pt")

    data = batches(rank, args.data_ms)
    step = 0
    while args.steps == 0 or step < args.steps:
        with mon.step() as s:  # 3
            inputs, targets = next(data)
            loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            s.grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            s.loss = loss  # read later, off the step path
        step += 1
        if mon.should_stop:  # 4: `ringtop ctl stop`, or the UI
            break
    mon.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
