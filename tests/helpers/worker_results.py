"""How the suite's tensor-parallel worker scripts end (run by `run_worker_script`): rank 0's
tensors in rank-0.pt, each rank's facts in rank-R.json, then every rank leaves the group together
and exits through `exit_rank` (tests/README.md says why)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from ringtop.agent.distributed import exit_rank


def gloo_rank() -> tuple[int, Any]:
    """Join the launcher's gloo group: (this rank, its CPU DistContext), the seed set alike on
    every rank."""
    from ringtop.strategies.base import DistContext

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    return rank, DistContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo")


def finish(out: Path, rank: int, found: dict[str, Any], saved: Any = None) -> int:
    if rank == 0 and saved is not None:
        torch.save(saved, out / "rank-0.pt")
    (out / f"rank-{rank}.json").write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run(main: Callable[[], int]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    exit_rank(main())
