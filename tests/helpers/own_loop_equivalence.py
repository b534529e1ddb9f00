"""A plain torchrun training loop run twice in one process, unwatched and then with ringtop.Monitor,
for DDP and for FSDP2: each rank writes OUT/rank-R.json with both runs' losses (as float.hex) and a
digest of the final parameters; then a third, watched DDP run whose comm hook reduces with torch's
Python all-reduce hook (divide by N, then sum) instead of as DDP does without one (scale by 1/N,
then sum): the equality check must see that change (on 3 ranks; on 2, halving is exact either way).
`own_loop_equivalence.py OUT`."""

import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from conftest import poll_until
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ringtop
from ringtop.agent.distributed import exit_rank
from ringtop.protocol import free_tcp_ports
from ringtop.strategies import ddp as ddp_strategy

STEPS = 6


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(24, 40), nn.Linear(40, 40), nn.Linear(40, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def wrapped(kind: str) -> nn.Module:
    torch.manual_seed(0)
    model = Net()
    if kind == "ddp":
        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer)
    return fully_shard(model)


def train(kind: str, mon_options: dict | None) -> tuple[list[str], str]:
    model = wrapped(kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(7 + dist.get_rank())
    mon = ringtop.Monitor(model, optimizer, **mon_options) if mon_options is not None else None
    # the data comes from torch's global generator: the Monitor must not draw on it
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(16, 24), torch.randn(16, 8)
        if mon is not None:
            with mon.step() as step:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                step.loss = loss
        else:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item().hex())
    if mon is not None:
        mon.close()
        def ringtop_threads() -> list[str]:
            return [t.name for t in threading.enumerate() if t.name.startswith("ringtop")]
        # the gatekeeper's ZeroMQ context ends in the background
        poll_until(lambda: not ringtop_threads(), 10, "no ringtop thread left after close",
                   interval_s=0.02, detail=lambda: str(ringtop_threads()))
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        local = value.full_tensor() if hasattr(value, "full_tensor") else value
        digest.update(name.encode() + local.detach().contiguous().numpy().tobytes())
    return losses, digest.hexdigest()


def options(name: str, out: Path) -> dict:
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))  # rank 0's count
    return {"run_id": f"{os.environ['RINGTOP_TEST_RUN_ID']}-{name}", "log_dir": str(out / f"logs-{name}"),
            "publish": publish, "relay": relay, "control": control}


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {}
    for kind in ("ddp", "fsdp"):
        plain = train(kind, None)
        watched = train(kind, options(kind, out))
        result[kind] = {"plain": plain[0], "watched": watched[0], "plain_params": plain[1],
                        "watched_params": watched[1]}
    ddp_strategy._builtin_allreduce = ddp_strategy.default_hooks.allreduce_hook
    result["ddp_mutated_params"] = train("ddp", options("mutated", out))[1]
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_rank(main())
