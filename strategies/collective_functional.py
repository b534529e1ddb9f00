"""Records DTensor's collectives (tensor parallelism), which go through
`torch.distributed._functional_collectives` and hand back a tensor that waits at its first use
(`wait_tensor`) instead of a work.

A traced functional collective stays open from its issue until `wait_tensor` returns on its output
(or a view of it), so a collective whose peer never joins stays in flight in the ledger; the wait is
exposed time on the training thread (on GPU, a stall between events on the compute stream), issue
to the wait's return the collective's busy interval, an upper bound. One nobody waited on by the
step's end is closed then. The recorder, the knobs and the clocks are `collective_hooks`'s.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from ringtop.strategies import collective_hooks as hooks
from ringtop.strategies.base import CommRecorder
from ringtop.strategies.collective_naming import argument, nbytes

# name -> (kind, position of its group argument, whether the payload is the gathered output)
_FUNCTIONAL_OPS: dict[str, tuple[str, int, bool]] = {
    "all_reduce": ("all_reduce", 2, False),
    "all_gather_single": ("all_gather", 2, True),
    "reduce_scatter_single": ("reduce_scatter", 3, False),
    "all_to_all_single": ("all_to_all", 3, False),
}
"""torch.distributed._functional_collectives' functions DTensor calls by attribute (its
redistributions: a RowwiseParallel output's all-reduce, a ColwiseParallel input gradient's), with
the payload counted as `_OPS` counts it (an all-gather by its output)."""
_functional_on = False
TIME_FUNCTIONAL_WAITS = True
"""Close a functional collective when its output is waited on (timed) rather than when it is
issued. Only a test turns it off, to show that its timing checks fail without it."""
_functional_open: dict[int, tuple[CommRecorder, int, Any]] = {}
"""Functional collectives issued and not yet waited on: the storage address of the tensor the
collective writes -> (recorder, handle, device start event or None)."""


def _storage_key(t: Any) -> int | None:
    """What a collective's output and every view of it share (DTensor waits on views too)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (fake, meta): never matched
        return None


def _functional_group(group: Any) -> Any:
    """The ProcessGroup a functional collective runs on (DTensor passes a mesh dimension, which
    resolves to the group's registered name)."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d

    resolved = funcol._resolve_group(group)
    return distributed_c10d._resolve_process_group(resolved) if isinstance(resolved, str) else resolved


def _wrap_functional(fn: Callable[..., Any], kind: str, group_at: int, gathered: bool) -> Callable[..., Any]:
    """Records each call's kind, bytes and group at its issue, and leaves it open (in flight in
    the ledger) until `wait_tensor` is called on its output: the call hands back a tensor that
    waits at its first use (AsyncCollectiveTensor), not a work whose future could say when it
    completed."""
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorder = hooks.current_recorder()
        if recorder is None or not _functional_on or hooks.inside_traced_call():
            return fn(*args, **kwargs)
        try:
            group = _functional_group(argument(args, kwargs, group_at, "group"))
            size, label = dist.get_world_size(group), hooks.group_name(group)
        except Exception:  # noqa: BLE001 - still counted, under a name of its own
            size, label = 0, "functional"
        tensor = argument(args, kwargs, 0, "self")
        if hooks.before_issue is not None:
            hooks.before_issue(kind)
        handle = recorder.begin(kind, nbytes(tensor) * (size if gathered else 1), size, label,
                                hooks.shapes_digest(tensor))
        start = None
        if getattr(recorder, "end_device", None) is not None and isinstance(tensor, torch.Tensor):
            start = hooks.device_start(tensor)
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            recorder.end(handle)
            raise
        key = _storage_key(getattr(out, "elem", out)) if TIME_FUNCTIONAL_WAITS else None
        if key is None:
            hooks.finish(recorder, handle)
        else:
            stale = _functional_open.pop(key, None)
            if stale is not None:  # its storage was freed and reused: it cannot be in flight
                stale[0].end(stale[1])
            _functional_open[key] = (recorder, handle, start)
        return out

    traced.__ringtop_traced__ = True
    return traced


def _wrap_functional_wait(wait: Callable[..., Any]) -> Callable[..., Any]:
    """`wait_tensor` on a traced collective's output (AsyncCollectiveTensor calls it at first use):
    the collective is closed when it returns, and the time the training thread spent inside is
    exposed communication. Host path: gloo has finished the collective when the wait returns, so
    issue -> return is its busy interval (an upper bound, by the wait's lateness when the result
    was already there). GPU path: the wait only makes the current stream wait; events around it
    on that stream give the stall (when it is the compute stream) and the end of the interval."""
    @functools.wraps(wait)
    def traced_wait(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        key = _storage_key(tensor) if _functional_open else None
        opened = _functional_open.pop(key, None) if key is not None else None
        if opened is None:
            return wait(tensor, *args, **kwargs)
        recorder, handle, start = opened
        if start is not None:
            stream = hooks.device_timing.current_stream(tensor.device)
            before = hooks.device_timing.event()
            before.record(stream)
            try:
                return wait(tensor, *args, **kwargs)
            finally:
                after = hooks.device_end(recorder, handle, start, None, stream)
                if hooks.on_compute_stream(stream):
                    recorder.blocked_device(before, after, handle=handle)
        t0 = time.perf_counter_ns()
        try:
            return wait(tensor, *args, **kwargs)
        finally:
            hooks.finish(recorder, handle)
            if hooks.on_training_thread():
                recorder.blocked(t0, time.perf_counter_ns(), handle)

    traced_wait.__ringtop_traced__ = True
    return traced_wait


def trace_functional_collectives() -> None:
    """Wrap the functional collectives and their `wait_tensor` once (idempotent); they record
    only inside `functional_collectives_traced`. Called by the strategy that imports DTensor
    (tensor parallelism), so no other rank's start-up pays for the import."""
    from torch.distributed import _functional_collectives as funcol

    with hooks.install_lock:
        for name, (kind, group_at, gathered) in _FUNCTIONAL_OPS.items():
            fn = getattr(funcol, name, None)
            if fn is not None and not getattr(fn, "__ringtop_traced__", False):
                setattr(funcol, name, _wrap_functional(fn, kind, group_at, gathered))
        if not getattr(funcol.wait_tensor, "__ringtop_traced__", False):
            funcol.wait_tensor = _wrap_functional_wait(funcol.wait_tensor)


def close_unwaited_functional() -> None:
    """Close the functional collectives whose output nobody waited on by the step's end (none in
    DTensor's eager path, which waits every output it uses): the step did not block on them, so
    they are not left in flight in the ledger; counted as done now."""
    while _functional_open:
        _, (recorder, handle, _) = _functional_open.popitem()
        recorder.end(handle)


@contextlib.contextmanager
def functional_collectives_traced() -> Iterator[None]:
    """Count the functional collectives issued inside (a tensor-parallel step), with `active`'s
    recorder. Elsewhere they stay uncounted: FSDP's gradient norm reduces through them, and its
    traffic prediction leaves that scalar out."""
    global _functional_on
    before, _functional_on = _functional_on, True
    try:
        yield
    finally:
        _functional_on = before
        if not before:
            close_unwaited_functional()
