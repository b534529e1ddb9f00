"""An own DDP loop under ringtop.Monitor, through `step_end`, where rank 1 holds rank 0 up three
times: asleep in its model's forward at step 2 (start-up: no usual step time yet), in its data
part at step 6, and after its optimizer step at step 20, where rank 0 waits in ringtop's own
diagnosis round. `own_loop_hang.py OUT` writes OUT/rank-R.json ({}): the logs say the rest.
The lines marked `# mark:NAME` are where the test expects each rank to be placed."""

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
from ringtop.agent.distributed import exit_rank
from ringtop.protocol import free_tcp_ports

FORWARD_SLEEP_S = 9.0
"""Longer than the start-up report (5 s) and the hang watch's settling, far under the 60 s warm-up."""
SHORT_SLEEP_S = 2.0
DUE_STEP = 20
"""The diagnosis round's step (every 20): a collective of ringtop's own after the step."""


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 4)
        self.sleep_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # mark:forward
        return self.layer(x)


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = Net()
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    publish, relay, control = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(3))
    mon = ringtop.Monitor(
        model,
        optimizer,
        run_id=os.environ["RINGTOP_TEST_RUN_ID"],
        log_dir=str(out / "logs"),
        publish=publish,
        relay=relay,
        control=control,
        stall_factor=1.0,
        stall_floor_s=0.3,
    )
    generator = torch.Generator().manual_seed(dist.get_rank())
    culprit = dist.get_rank() == 1
    for step in range(1, DUE_STEP + 2):
        if step == 6 and culprit:
            time.sleep(SHORT_SLEEP_S)  # mark:data
        net.sleep_s = FORWARD_SLEEP_S if step == 2 and culprit else 0.0
        loss = model(torch.randn(4, 8, generator=generator)).square().mean()
        loss.backward()  # mark:backward
        optimizer.step()
        optimizer.zero_grad()
        if step == DUE_STEP and culprit:
            time.sleep(SHORT_SLEEP_S)  # mark:after
        mon.step_end(loss)  # mark:step_end
    mon.close()
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps({}))
    return 0


if __name__ == "__main__":
    exit_rank(main())
