"""A script that gets ringtop.Monitor wrong, then watches a DDP loop through `step_end` (rank 1's
loss NaN at step 4, the gradient norm passed along; rank 1 stalls at step 6) and ends without
`close()`: the Monitor must close itself at exit. `own_loop_unclosed.py OUT` writes OUT/rank-R.json
with the one-line errors of the wrong calls."""

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
from ringtop.agent.config import ConfigError
from ringtop.agent.loop.own_loop import MonitorError
from ringtop.protocol import free_tcp_ports


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    plain = nn.Linear(8, 4)
    model = DistributedDataParallel(nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrong = {
        "unknown option": lambda: ringtop.Monitor(model, optimizer, steps=5),
        "bad run id": lambda: ringtop.Monitor(model, optimizer, run_id="../x"),
        "not wrapped": lambda: ringtop.Monitor(plain, optimizer),
        "metrics as a tuple": lambda: ringtop.Monitor(model, optimizer, metrics=("127.0.0.1", 9400)),
        "not an optimizer": lambda: ringtop.Monitor(model, "adam"),
    }
    errors = {}
    for name, call in wrong.items():
        try:
            call()
        except (ConfigError, MonitorError) as exc:
            errors[name] = str(exc)
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))
    mon = ringtop.Monitor(model, optimizer, run_id=os.environ["RINGTOP_TEST_RUN_ID"], log_dir=str(out / "logs"),
                          publish=publish, relay=relay, control=control, stall_factor=1.0, stall_floor_s=0.3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(1, 7):
        if step == 6 and dist.get_rank() == 1:
            time.sleep(1.5)  # rank 1 stalls loading its batch; rank 0 then waits in the all-reduce
        loss = model(torch.randn(4, 8, generator=generator)).square().mean()
        if step == 4 and dist.get_rank() == 1:
            loss = loss * float("nan")  # rank 1 diverges at step 4
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
        mon.step_end(loss, grad_norm=norm)
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(errors))
    dist.destroy_process_group()
    return 0  # no mon.close(): the Monitor closes itself at exit


if __name__ == "__main__":
    sys.exit(main())  # as a plain script ends (exit_rank would leave without running atexit)
