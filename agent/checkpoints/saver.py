"""Saving checkpoints from a running job: full or sharded, in the foreground or in the background.

All ranks call `save` on the same step (it is collective). A background save stages the state
(a detached copy) and writes it on a thread of its own while training goes on (a sharded one over
a gloo group that only that thread uses); `poll`, called by every rank at
each step boundary, agrees across ranks whether it has finished, so every rank takes the same
decision about the next command. Only one save runs at a time.

A save either completes on every rank or fails on every rank: each rank does its part inside a
try, then all join one small agreement (the first failure's rank and text), so no rank leaves a save
early and none waits for one that did. Writes go through protocol/safe_files.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringtop.agent.checkpoints import format as ckpt
from ringtop.agent.control.channel import all_gather_fixed
from ringtop.agent.loop import faults
from ringtop.protocol import safe_files
from ringtop.strategies.base import Strategy

ERROR_BYTES = 512
"""Of a rank's failure text, what every rank learns (the agreement's fixed frame)."""


class SaveFailed(RuntimeError):
    """A save that failed on some rank: raised on every rank at the same point, with the same text."""


@dataclass
class _InFlight:
    kind: str
    step: int
    tmp_name: str
    final_name: str
    meta: dict[str, Any]
    started: float
    dir_fd: int = -1
    """Rank 0: the opened checkpoint folder."""
    tmp_fd: int = -1
    """The opened temporary folder (rank 0; every rank for a sharded save)."""
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def close(self) -> None:
        for fd in (self.tmp_fd, self.dir_fd):
            if fd >= 0:
                os.close(fd)
        self.tmp_fd = self.dir_fd = -1


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


def failure_text(exc: BaseException, rank: int) -> tuple[int, str]:
    """(the rank it happened on, what happened): DCP's own collective error names the first rank
    whose part failed; any other error is this rank's."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exc, CheckpointException) and exc.failures:
        rank = min(exc.failures)
        exc = exc.failures[rank][0]
    return rank, str(exc) if isinstance(exc, safe_files.UnsafePathError) else f"{type(exc).__name__}: {exc}"


def _safe_writer(path: str, fault: Callable[[str], None] | None):
    """DCP's file writer, creating its files exclusively and following no link (a name planted in
    the temporary folder fails the save instead of redirecting it), with the tests' fault hook
    called inside its write (DCP then fails the save on every rank itself)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class ExclusiveFiles(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            if "r" in mode:
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         safe_files.file_mode())
            with os.fdopen(fd, mode) as stream:
                yield stream

    class Writer(FileSystemWriter):
        def write_data(self, plan, planner):
            if fault is not None:
                fault("write")
            return super().write_data(plan, planner)

    writer = Writer(path)
    writer.fs = ExclusiveFiles()
    return writer


class CheckpointManager:
    def __init__(self, directory: str, rank: int, group: dist.ProcessGroup | None,
                 io_group: dist.ProcessGroup | None, keep: int = 0, delay_s: float = 0.0):
        self.directory = Path(directory)
        self.rank = rank
        self.group = group
        """For the training thread's agreements (the control group)."""
        self.io_group = io_group
        """For DCP's own collectives, which a background save runs on its thread."""
        self.world_size = dist.get_world_size(group) if group is not None else 1
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
        when a background save was started (see `poll`). A failure on any rank raises SaveFailed
        on every rank, at the same point, naming the rank."""
        if self.busy:
            raise RuntimeError(f"a {self.in_flight.kind} checkpoint of step {self.in_flight.step} is still being "
                               "written; try again when it is done")
        flight = _InFlight(kind, step, ckpt.temporary_name(step, kind), ckpt.checkpoint_name(step, kind), meta,
                           time.perf_counter())
        self._agree(flight, self._attempt(lambda: self._prepare(flight)))
        if kind == ckpt.SHARDED:
            self._agree(flight, self._attempt(lambda: self._open_shared_tmp(flight)) if self.rank != 0 else None)
        if kind == ckpt.FULL:
            state = strategy.full_state_dict()
            if background and self.rank == 0:
                state = detached_copy(state)
            if self.rank == 0:
                def write() -> None:
                    ckpt.write_full(flight.tmp_fd, step, state[0], state[1], meta, fault=_fault(kind))
            else:
                def write() -> None:
                    if (fault := _fault(kind)) is not None:
                        fault("write")
        else:
            model_state, optim_state = strategy.sharded_state_dict()
            sharded = {"model": model_state, "optim": optim_state}
            if background:
                sharded = detached_copy(this_ranks_share(sharded, self.rank, self.io_group))

            def write() -> None:
                import torch.distributed.checkpoint as dcp

                writer = _safe_writer(safe_files.fd_path(flight.tmp_fd), _fault(kind))
                dcp.save(sharded, storage_writer=writer, process_group=self.io_group)
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
        return self._publish(flight)

    def _prepare(self, flight: _InFlight) -> None:
        """Rank 0 opens the verified checkpoint folder and makes a fresh temporary folder in it
        (whatever stood at that name, a link included, removed without being followed); every
        rank of a sharded save then opens that folder itself, refusing a link."""
        fault = _fault(flight.kind)
        if fault is not None:
            fault("prepare")
        if self.rank == 0:
            flight.dir_fd = safe_files.open_dir(self.directory, what="checkpoint folder")
            safe_files.remove_tree(flight.dir_fd, flight.tmp_name)
            os.mkdir(flight.tmp_name, safe_files.dir_mode(), dir_fd=flight.dir_fd)
            if fault is not None:
                fault("open")
            flight.tmp_fd = safe_files.open_subdir(flight.dir_fd, flight.tmp_name, create=False,
                                                   what="temporary checkpoint folder")

    def _open_shared_tmp(self, flight: _InFlight) -> None:
        if (fault := _fault(flight.kind)) is not None:
            fault("open")
        dir_fd = safe_files.open_dir(self.directory, create=False, what="checkpoint folder")
        try:
            flight.tmp_fd = safe_files.open_subdir(dir_fd, flight.tmp_name, create=False,
                                                   what="temporary checkpoint folder")
        finally:
            os.close(dir_fd)

    def _run_catching(self, flight: _InFlight, write: Callable[[], None]) -> Callable[[], None]:
        """The writing part (rank 0's injected pause included), errors kept for `_publish`."""
        def run() -> None:
            try:
                write()
                if self.delay_s and self.rank == 0:
                    time.sleep(self.delay_s)
            except BaseException as exc:
                flight.error = exc
        return run

    def _publish(self, flight: _InFlight) -> ckpt.SavedCheckpoint | None:
        """Every rank agrees the data is written, rank 0 publishes it, and they agree again."""
        self._agree(flight, flight.error)
        saved = None

        def publish() -> None:
            nonlocal saved
            if self.rank != 0:
                return
            if flight.kind == ckpt.SHARDED:
                size = ckpt.finish_sharded(flight.tmp_fd, flight.step, flight.meta)
            else:
                size = safe_files.finish_tree(flight.tmp_fd)
            ckpt.publish(flight.dir_fd, flight.tmp_name, flight.final_name)
            saved = ckpt.SavedCheckpoint(str(self.directory / flight.final_name), flight.step, flight.kind, size,
                                         time.perf_counter() - flight.started)
            self._prune(flight.dir_fd)
        self._agree(flight, self._attempt(publish))
        flight.close()
        return saved

    def _attempt(self, part: Callable[[], None]) -> BaseException | None:
        try:
            part()
        except Exception as exc:
            return exc
        return None

    def _agree(self, flight: _InFlight, error: BaseException | None) -> None:
        """Collective: every rank learns whether any rank's part failed, and the first failure;
        then all raise it together (rank 0 removing its temporary folder first)."""
        mine = b""
        if error is not None:
            rank, text = failure_text(error, self.rank)
            text = re.sub(r"/proc/self/fd/\d+", str(self.directory / flight.tmp_name), text)  # a writer's view
            mine = f"{rank}\x1f{text}".encode()[:ERROR_BYTES]
        everyone = [mine] if self.group is None else all_gather_fixed(mine, ERROR_BYTES, self.world_size, self.group)
        failed = next((e.decode(errors="replace") for e in everyone if e), None)
        if failed is None:
            return
        rank, _, text = failed.partition("\x1f")
        if self.rank == 0 and flight.dir_fd >= 0:
            try:
                safe_files.remove_tree(flight.dir_fd, flight.tmp_name)
            except OSError:
                pass
        flight.close()
        raise SaveFailed(f"{flight.kind} checkpoint of step {flight.step} failed on rank {rank}: {text}")

    def _prune(self, dir_fd: int) -> None:
        """Only real checkpoint folders of this user's are removed; links and strangers are left."""
        if self.keep <= 0:
            return
        done = sorted(entry.name for entry in os.scandir(dir_fd) if entry.name.startswith("step-")
                      and safe_files.entry_kind(dir_fd, entry.name) == "dir" and _is_checkpoint(dir_fd, entry.name))
        for old in done[:-self.keep]:
            safe_files.remove_tree(dir_fd, old)

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _all(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        if self.group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())


def _is_checkpoint(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(f"{name}/{ckpt.META_FILE}", dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _fault(kind: str) -> Callable[[str], None] | None:
    hook = faults.checkpoint_fault
    return None if hook is None else (lambda stage: hook(stage, kind))
