"""Process group set-up: torchrun's environment when present, else Slurm's (`srun` starting each
rank), else a one-process world."""

from __future__ import annotations

import datetime
import gc
import os
import re
import sys

import torch
import torch.distributed as dist

from ringtop.agent.restarts import restart_count
from ringtop.protocol import free_tcp_port
from ringtop.strategies.base import DistContext

DEFAULT_TIMEOUT_S = 600
FLIGHT_RECORDER_ENTRIES = "2000"
"""PyTorch's NCCL Flight Recorder keeps this many collectives per rank unless the user set
TORCH_NCCL_TRACE_BUFFER_SIZE: `ringtop ctl dump` writes them where `fr_trace` reads them."""


class DeviceError(RuntimeError):
    """The device asked for is not here."""


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for, but torch sees no CUDA device")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def slurm_environment(env: dict[str, str]) -> dict[str, str]:
    """torch's variables from Slurm's, for ranks started by `srun` itself (no torchrun): rank,
    world size and local rank from the task's, rank 0's node the first of the job's nodes, the port
    derived from the job id (the same on every task) unless MASTER_ADDR / MASTER_PORT are set. {} when
    not under srun, or when torchrun set them already. (A job's batch script also has SLURM_PROCID,
    with the job's task count: only a step `srun` started has SLURM_STEP_NUM_TASKS.)"""
    if "RANK" in env or "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return {}
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_STEP_NUM_TASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodes),
        "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0") or 0) % 10000),
    }


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `gpu[07-09,12],cpu1` -> `gpu07`."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        return nodelist
    prefix, ranges = match.groups()
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def attempt_store(env: dict[str, str] | os._Environ, rank: int, world_size: int,
                  timeout: datetime.timedelta) -> dist.Store | None:
    """The store a restarted attempt's process group meets in, or None: torch's own (env://).

    torchrun --standalone keeps its store across restarts, and the ranks of a new attempt read the
    addresses the dead attempt's ranks left there (gloo: "connection refused" to a rank of the
    last attempt, so every restart failed at set-up). Each attempt gets keys of its own."""
    attempt = restart_count(env)
    if attempt == 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"ringtop/attempt_{attempt}", store)


def init_distributed(device_choice: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    os.environ.update(slurm_environment(dict(os.environ)))
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(device_choice, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)  # read at group creation
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            store = attempt_store(os.environ, rank, world_size, timeout)
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, store=store)
        else:
            init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
            dist.init_process_group(backend, init_method=init_method, rank=0, world_size=1, timeout=timeout)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)


_COLLECTIVE_WORKER_THREADS = frozenset({"pt_gloo_runloop"})
"""Native threads that run a gloo process group's collectives (named so by PyTorch)."""


def collective_worker_threads() -> int:
    """How many gloo worker threads are alive in this process (Linux; 0 where /proc is absent)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    alive = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                alive += f.read().strip() in _COLLECTIVE_WORKER_THREADS
        except OSError:
            continue  # the thread ended while we looked
    return alive


def exit_rank(code: int) -> None:
    """End a rank without the abort PyTorch's gloo can cause at interpreter exit.

    A gloo worker thread drops its reference to a finished collective's tensors only after the
    waiting thread was released; those tensors belong to Python objects, so dropping them takes
    the GIL. If the interpreter is finalizing by then, CPython ends the thread inside that C++
    destructor and the process dies with SIGABRT ("terminate called without an active
    exception"). `destroy_process_group` joins these threads only when nothing else holds the
    group, and DTensor / FSDP / DeepSpeed keep it in C++ state of their own. So: destroy the
    groups, and if worker threads outlive that, flush what this process wrote and leave without
    finalizing. Everything of ringtop's (telemetry, logs, checkpoints) is closed before this."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    if collective_worker_threads() == 0:
        sys.exit(code)
    _flush_messaging(timeout_s=3.0)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _flush_messaging(timeout_s: float) -> None:
    """Let ZeroMQ send what closed sockets still hold (their linger), at most `timeout_s`."""
    import threading

    import zmq

    if zmq.Context._instance is None:
        return
    done = threading.Thread(target=zmq.Context.instance().term, daemon=True)
    done.start()
    done.join(timeout_s)
