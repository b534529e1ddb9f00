"""Process group set-up: torchrun's environment when present, else a one-process world."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from ringtop.protocol import free_tcp_port
from ringtop.strategies.base import DistContext

DEFAULT_TIMEOUT_S = 600


class DeviceError(RuntimeError):
    """The device asked for is not here."""


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for, but torch sees no CUDA device")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_choice: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(device_choice, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        else:
            init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
            dist.init_process_group(backend, init_method=init_method, rank=0, world_size=1, timeout=timeout)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)
