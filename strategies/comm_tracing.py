"""Records the collectives a strategy issues through `torch.distributed`'s functions.

FSDP2 and DeepSpeed call `torch.distributed.<op>` by attribute at call time, so wrapping those
attributes sees every collective they issue: kind, payload bytes (the full logical tensor, as
nccl-tests counts it), group size, issue time and completion time. Completion of an async op is
taken from its work's future (no device synchronisation); a blocking op completes on return.
Recording happens only while a recorder is active (`active(recorder)`), so ringtop's own control
broadcasts and checkpoint gathers are not counted as training traffic.

Exposed communication is the time the training thread itself is blocked: inside a blocking
collective, or inside `Work.wait()` (wrapped on the class, since FSDP2 and DeepSpeed wait on the
works they issued asynchronously).

`comm_delay_s` injects a delay into every traced collective's completion (fault injection for tests
and demos: a slow link).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from .base import CommRecorder


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _arg(args: tuple, kwargs: dict, index: int, *names: str) -> Any:
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[index] if len(args) > index else None


# op name -> (kind, payload tensor getter)
_OPS: dict[str, tuple[str, Callable[[tuple, dict], Any]]] = {
    "all_reduce": ("all_reduce", lambda a, k: _arg(a, k, 0, "tensor")),
    "all_reduce_coalesced": ("all_reduce", lambda a, k: _arg(a, k, 0, "tensors")),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input")),
    "reduce_scatter_single": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input")),
    "_reduce_scatter_base": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input")),
    "reduce_scatter": ("reduce_scatter", lambda a, k: _arg(a, k, 1, "input_list")),
    "all_gather_into_tensor": ("all_gather", lambda a, k: _arg(a, k, 0, "output_tensor")),
    "all_gather_single": ("all_gather", lambda a, k: _arg(a, k, 0, "output_tensor")),
    "_all_gather_base": ("all_gather", lambda a, k: _arg(a, k, 0, "output_tensor")),
    "all_gather": ("all_gather", lambda a, k: _arg(a, k, 0, "tensor_list")),
    "broadcast": ("broadcast", lambda a, k: _arg(a, k, 0, "tensor")),
    "reduce": ("reduce", lambda a, k: _arg(a, k, 0, "tensor")),
    "all_to_all_single": ("all_to_all", lambda a, k: _arg(a, k, 1, "input")),
    # Point to point: only the batched form. `isend`/`irecv` themselves stay unwrapped, because
    # `P2POp` checks that it was handed exactly those functions.
    "batch_isend_irecv": ("p2p", lambda a, k: [op.tensor for op in (_arg(a, k, 0, "p2p_op_list") or [])]),
}

_state = threading.local()
_recorder: CommRecorder | None = None
_training_thread: int | None = None
_installed = False
_install_lock = threading.Lock()
comm_delay_s = 0.0


def _on_training_thread() -> bool:
    return threading.get_ident() == _training_thread


def _finish(recorder: CommRecorder, handle: int) -> None:
    if comm_delay_s:
        time.sleep(comm_delay_s)
    recorder.end(handle)


def _wrap(name: str, fn: Callable[..., Any], kind: str, payload: Callable[[tuple, dict], Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is None or getattr(_state, "inside", False):
            return fn(*args, **kwargs)
        group = kwargs.get("group")
        try:
            group_size = dist.get_world_size(group)
        except Exception:
            group_size = 0
        handle = recorder.begin(kind, _nbytes(payload(args, kwargs)), group_size)
        t0 = time.perf_counter_ns()
        _state.inside = True
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            recorder.end(handle)
            raise
        finally:
            _state.inside = False
        works = result if isinstance(result, list) else [result]
        if works and all(isinstance(w, dist.Work) for w in works):
            try:
                works[-1].get_future().then(lambda _f: _finish(recorder, handle))
            except Exception:  # a backend without futures: count it as done when issued
                recorder.end(handle)
        else:
            _finish(recorder, handle)
            if _on_training_thread():
                recorder.blocked(t0, time.perf_counter_ns())
        return result

    traced.__ringtop_traced__ = True
    return traced


def _wrap_wait(wait: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(wait)
    def traced_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is None or not _on_training_thread():
            return wait(self, *args, **kwargs)
        t0 = time.perf_counter_ns()
        try:
            return wait(self, *args, **kwargs)
        finally:
            recorder.blocked(t0, time.perf_counter_ns())

    traced_wait.__ringtop_traced__ = True
    return traced_wait


def install() -> None:
    """Wrap the functions (and `Work.wait`) once per process; idempotent."""
    global _installed
    with _install_lock:
        if _installed:
            return
        for name, (kind, payload) in _OPS.items():
            fn = getattr(dist, name, None)
            if fn is not None and not getattr(fn, "__ringtop_traced__", False):
                setattr(dist, name, _wrap(name, fn, kind, payload))
        if not getattr(dist.Work.wait, "__ringtop_traced__", False):
            dist.Work.wait = _wrap_wait(dist.Work.wait)
        _install_pipeline_p2p()
        _installed = True


def _install_pipeline_p2p() -> None:
    """torch.distributed.pipelining sends activations through its private `_batch_p2p`, which
    calls `isend`/`irecv` directly for one-way batches: wrap that helper to see them."""
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        return
    fn = getattr(schedules, "_batch_p2p", None)
    if fn is not None and not getattr(fn, "__ringtop_traced__", False):
        schedules._batch_p2p = _wrap("_batch_p2p", fn, "p2p",
                                     lambda a, k: [op.tensor for op in (_arg(a, k, 0, "p2p_ops") or [])])


@contextlib.contextmanager
def active(recorder: CommRecorder | None) -> Iterator[None]:
    """Record into `recorder` for the duration (typically one training step)."""
    global _recorder, _training_thread
    if recorder is None:
        yield
        return
    install()
    previous, _recorder = _recorder, recorder
    previous_thread, _training_thread = _training_thread, threading.get_ident()
    try:
        yield
    finally:
        _recorder, _training_thread = previous, previous_thread
