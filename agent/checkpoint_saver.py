"""Saving checkpoints from a running job: full or sharded, in the foreground or in the background.

All ranks call `save` on the same step (it is collective). A background save stages the state
(a detached copy) and writes it on a thread of its own while training goes on (a sharded one over
a gloo group that only that thread uses); `poll`, called by every rank at
each step boundary, agrees across ranks whether it has finished, so every rank takes the same
decision about the next command. Only one save runs at a time.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringtop.strategies.base import Strategy

from . import checkpoint_format as ckpt


@dataclass
class _InFlight:
    kind: str
    step: int
    tmp: Path
    final: Path
    meta: dict[str, Any]
    started: float
    thread: threading.Thread | None = None
    error: BaseException | None = None


def detached_copy(state: Any, _copies: dict | None = None) -> Any:
    """A copy that training cannot change under a background writer (DTensors stay DTensors:
    DCP needs their sharding). Tensors that are the same view of the same memory (a tied weight
    under both its names) stay one tensor, so the writer still stores it once."""
    copies = {} if _copies is None else _copies
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape), local.stride(),
               local.dtype, type(state))
        if key not in copies or local.numel() == 0:
            copies[key] = state.detach().clone()
        return copies[key]
    if isinstance(state, dict):
        return {k: detached_copy(v, copies) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(detached_copy(v, copies) for v in state)
    return state


def this_ranks_share(state: dict[str, Any], rank: int, group: dist.ProcessGroup | None) -> dict[str, Any]:
    """`state` without the replicated tensors other ranks write: a tensor every rank holds alike
    (DDP and DeepSpeed state, on every rank) goes to one rank, balanced by bytes. DCP would write
    each only once anyway, but a background save stages (copies) what it is given, so each rank
    copies only its share. Sharded tensors (DTensors) and non-tensors stay as they are."""
    if group is None:
        return state
    specs = {path: (tuple(t.shape), str(t.dtype)) for path, t in _plain_tensors(state)}
    everyone: list[dict] = [{} for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(everyone, specs, group=group)
    common = [path for path, spec in specs.items() if all(other.get(path) == spec for other in everyone)]
    loads = [0] * len(everyone)
    owner: dict[tuple, int] = {}
    for path in sorted(common, key=lambda p: (-math.prod(specs[p][0]), p)):
        owner[path] = loads.index(min(loads))
        loads[owner[path]] += math.prod(specs[path][0])
    return _without(state, lambda path: owner.get(path, rank) != rank)


def _plain_tensors(state: Any, path: tuple = ()) -> list[tuple[tuple, torch.Tensor]]:
    from torch.distributed.tensor import DTensor

    if isinstance(state, torch.Tensor):
        return [] if isinstance(state, DTensor) else [(path, state)]
    if isinstance(state, dict):
        return [hit for k, v in state.items() for hit in _plain_tensors(v, (*path, str(k)))]
    return []


def _without(state: Any, drop: Callable[[tuple], bool], path: tuple = ()) -> Any:
    if isinstance(state, dict):
        return {k: _without(v, drop, (*path, str(k))) for k, v in state.items()
                if not (isinstance(v, torch.Tensor) and drop((*path, str(k))))}
    return state


class CheckpointManager:
    def __init__(self, directory: str, rank: int, group: dist.ProcessGroup | None,
                 io_group: dist.ProcessGroup | None, keep: int = 0, delay_s: float = 0.0):
        self.directory = Path(directory)
        self.rank = rank
        self.group = group
        """For the training thread's agreements (the control group)."""
        self.io_group = io_group
        """For DCP's own collectives, which a background save runs on its thread."""
        self.keep = keep
        self.delay_s = delay_s
        """Injected pause after the data is written, before it is published (tests kill a rank here)."""
        self.in_flight: _InFlight | None = None

    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    def save(self, strategy: Strategy, step: int, kind: str, meta: dict[str, Any], background: bool
             ) -> ckpt.SavedCheckpoint | None:
        """Collective. Returns the saved checkpoint (on rank 0) when done in the foreground; None
        when a background save was started (see `poll`)."""
        if self.busy:
            raise RuntimeError(f"a {self.in_flight.kind} checkpoint of step {self.in_flight.step} is still being "
                               "written; try again when it is done")
        t0 = time.perf_counter()
        final = self.directory / ckpt.checkpoint_name(step, kind)
        tmp = ckpt.temporary_path(self.directory, step, kind)
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        self._barrier()
        if kind == ckpt.FULL:
            state = strategy.full_state_dict()
            if background and self.rank == 0:
                state = detached_copy(state)
            write = (lambda: ckpt.write_full(tmp, step, state[0], state[1], meta)) if self.rank == 0 else None
        else:
            import torch.distributed.checkpoint as dcp

            model_state, optim_state = strategy.sharded_state_dict()
            sharded = {"model": model_state, "optim": optim_state}
            if background:
                sharded = detached_copy(this_ranks_share(sharded, self.rank, self.io_group))
            write = lambda: dcp.save(sharded, checkpoint_id=str(tmp), process_group=self.io_group)  # noqa: E731
        flight = _InFlight(kind, step, tmp, final, meta, t0)
        work = self._run_catching(flight, write)
        if background:
            flight.thread = threading.Thread(target=work, daemon=True, name="ringtop-checkpoint")
            flight.thread.start()
            self.in_flight = flight
            return None
        work()
        return self._publish(flight)

    def poll(self) -> ckpt.SavedCheckpoint | None:
        """Collective while a background save is in flight: the result once every rank's part is done."""
        flight = self.in_flight
        if flight is None:
            return None
        if not self._all(not flight.thread.is_alive()):
            return None
        self.in_flight = None
        if not self._all(flight.error is None):
            raise RuntimeError(f"background {flight.kind} checkpoint of step {flight.step} failed: {flight.error}")
        return self._publish(flight)

    def _run_catching(self, flight: _InFlight, write: Callable[[], None] | None) -> Callable[[], None]:
        """The writing part (rank 0's injected pause included), errors kept for `_publish`."""
        def run() -> None:
            try:
                if write is not None:
                    write()
                if self.delay_s and self.rank == 0:
                    time.sleep(self.delay_s)
            except BaseException as exc:
                flight.error = exc
        return run

    def _publish(self, flight: _InFlight) -> ckpt.SavedCheckpoint | None:
        if flight.error is not None:
            raise RuntimeError(f"{flight.kind} checkpoint of step {flight.step} failed: {flight.error}")
        saved = None
        if self.rank == 0:
            if flight.kind == ckpt.SHARDED:
                ckpt.finish_sharded(flight.tmp, flight.step, flight.meta)
            ckpt.publish(flight.tmp, flight.final)
            saved = ckpt.SavedCheckpoint(str(flight.final), flight.step, flight.kind, ckpt.dir_bytes(flight.final),
                                         time.perf_counter() - flight.started)
            self._prune()
        self._barrier()
        return saved

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        done = sorted(p for p in self.directory.glob("step-*") if p.is_dir())
        for old in done[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _all(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        if self.group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())
