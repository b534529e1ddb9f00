"""A rank's exit (agent/distributed.py: exit_rank): the premise of the guard — DTensor keeps a gloo
group's worker threads alive past destroy_process_group, so letting the interpreter finalize can
abort (a worker thread dropping Python-owned tensors is ended inside a C++ destructor) — and that
the guarded exit keeps the exit code and what the rank printed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import agent_env

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import os, sys
import torch, torch.distributed as dist
from ringtop.agent import distributed as rd
from ringtop.protocol import free_tcp_port

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_tcp_port()}", rank=0, world_size=1)
box = [None]
dist.all_gather_object(box, {"a": 1})
if sys.argv[1] == "dtensor":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    x = distribute_tensor(torch.ones(4, 4), init_device_mesh("cpu", (1,)), [Shard(0)])
    del x
alive_before = rd.collective_worker_threads()
dist.destroy_process_group()
import gc; gc.collect()
print(f"threads {alive_before} {rd.collective_worker_threads()}", end="")  # no newline: must be flushed
rd.exit_rank(int(sys.argv[2]))
"""


@pytest.mark.parametrize("use, left", [("plain", 0), ("dtensor", 2)])
def test_which_groups_outlive_destroy_and_the_exit_keeps_code_and_output(use, left):
    done = subprocess.run([sys.executable, "-c", SCRIPT, use, "3"], capture_output=True, text=True, env=agent_env(),
                          timeout=100)
    assert done.returncode == 3, done.stderr[-2000:]
    before, after = (int(n) for n in done.stdout.split()[1:3])
    assert before >= 1, "gloo runs its collectives on worker threads"
    assert (after > 0) == (left > 0), f"{use}: {after} gloo worker threads after destroy_process_group"
