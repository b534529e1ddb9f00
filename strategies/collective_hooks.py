"""Records the collectives a strategy issues through `torch.distributed`'s functions.

FSDP2 and DeepSpeed call `torch.distributed.<op>` by attribute at call time, so wrapping those
attributes sees every collective they issue: kind, payload bytes (the full logical tensor, as
nccl-tests counts it), group size, issue time and completion time. Recording happens only while a
recorder is active (`active(recorder)`), so ringtop's own control broadcasts and checkpoint gathers
are not counted as training traffic.

Completion, host path (CPU tensors, gloo): an async op completes when its work's future does (gloo
marks it when the collective has finished); a blocking op completes on return. No device involved.

Completion, GPU path (CUDA tensors, when the recorder has `end_device`): NCCL marks a work's future
complete when the collective is *enqueued*, so host times would only measure the issue. Instead a
CUDA event (timing enabled) is recorded on the issuing stream just before the issue (NCCL's stream
waits on that stream, so the collective cannot start earlier) and another in a callback chained on
the work's future: c10's `Future.then` runs the callback with current streams from the pool made to
wait on the future's CUDA events, which NCCL records on its own stream after the collective, so the
end event completes when the collective has. A blocking op's end event goes on the issuing stream
after the call (c10d's internal `wait()` made that stream wait for the collective). The events go to
the recorder, which reads them lazily with `query()` at the step boundary (never a synchronize).
Chosen over NCCL's own timing (`TORCH_NCCL_ENABLE_TIMING` + `Work._get_duration()`): that gives a
duration without a position on a timeline (so no union, overlap or exposed time), only for NCCL, and
only once the work has completed, which means holding every `Work` (and through it the collective's
output tensors, e.g. FSDP's unsharded parameters) past the step.

Exposed communication is the time the training thread itself is blocked: inside a blocking
collective, or inside `Work.wait()` (wrapped on the class, since FSDP2 and DeepSpeed wait on the
works they issued asynchronously). On GPU neither blocks the host: `Work.wait()` makes the current
stream wait, so when that stream is the training thread's compute stream (the current stream when
the step began) the stall is measured on the device, between events recorded just before and just
after the wait. Waits on point-to-point works (a pipeline's send/recv: mostly waiting for the other
stage, i.e. bubble) are reported apart, as p2p waits, not as exposed collective communication.
Each wait is reported with the handle of the collective waited on (a work's, kept by `id` with a
weak reference for the step), so the step's record of that collective carries its wait.

DTensor's collectives (tensor parallelism) are `collective_functional`'s; payload sizes and
group names `collective_naming`'s.

`comm_delay_s` injects a delay into every traced collective's completion (fault injection for tests
and demos: a slow link).

`step_annotation`, when set (by `profile STEPS`), opens a context around each training step, so the
profiler's trace marks where each step's work begins and ends.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from ringtop.strategies.base import CommRecorder
from ringtop.strategies.collective_naming import argument, first_tensor, group_name, nbytes, shapes_digest

# op name -> (kind, payload tensor getter)
_OPS: dict[str, tuple[str, Callable[[tuple, dict], Any]]] = {
    "all_reduce": ("all_reduce", lambda a, k: argument(a, k, 0, "tensor")),
    "all_reduce_coalesced": ("all_reduce", lambda a, k: argument(a, k, 0, "tensors")),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: argument(a, k, 1, "input")),
    "reduce_scatter_single": ("reduce_scatter", lambda a, k: argument(a, k, 1, "input")),
    "_reduce_scatter_base": ("reduce_scatter", lambda a, k: argument(a, k, 1, "input")),
    "reduce_scatter": ("reduce_scatter", lambda a, k: argument(a, k, 1, "input_list")),
    "all_gather_into_tensor": ("all_gather", lambda a, k: argument(a, k, 0, "output_tensor")),
    "all_gather_single": ("all_gather", lambda a, k: argument(a, k, 0, "output_tensor")),
    "_all_gather_base": ("all_gather", lambda a, k: argument(a, k, 0, "output_tensor")),
    "all_gather": ("all_gather", lambda a, k: argument(a, k, 0, "tensor_list")),
    "broadcast": ("broadcast", lambda a, k: argument(a, k, 0, "tensor")),
    "reduce": ("reduce", lambda a, k: argument(a, k, 0, "tensor")),
    "all_to_all_single": ("all_to_all", lambda a, k: argument(a, k, 1, "input")),
    # Point to point: only the batched form. `isend`/`irecv` themselves stay unwrapped, because
    # `P2POp` checks that it was handed exactly those functions.
    "batch_isend_irecv": ("p2p", lambda a, k: [op.tensor for op in (argument(a, k, 0, "p2p_op_list") or [])]),
}


_GROUP_POSITION = {
    "all_reduce": 2, "all_reduce_coalesced": 2, "reduce_scatter_tensor": 3, "reduce_scatter": 3,
    "_reduce_scatter_base": 3, "all_gather_into_tensor": 2, "_all_gather_base": 2, "all_gather": 2, "broadcast": 2,
    "reduce": 3, "all_to_all_single": 4, "batch_isend_irecv": 99, "_batch_p2p": 99,
}
"""Where each function takes its process group when it is passed by position."""


class CudaTiming:
    """The GPU path's clock: CUDA events on CUDA streams (tests substitute a stand-in)."""

    def is_device_tensor(self, t: torch.Tensor) -> bool:
        return t.is_cuda

    def in_use(self) -> bool:
        return torch.cuda.is_initialized()

    def current_stream(self, device: Any = None) -> Any:
        return torch.cuda.current_stream(device)

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)


device_timing = CudaTiming()

_state = threading.local()
_recorder: CommRecorder | None = None
_training_thread: int | None = None
_compute_stream: Any = None
# id(work) -> (weak reference, device or None for the host path, point-to-point?, the recorder's
# handle) for every traced work, so its wait is told apart and named. Cleared after each step.
_issued: dict[int, tuple[Any, Any, bool, int]] = {}
_installed = False
install_lock = threading.Lock()
comm_delay_s = 0.0
before_issue: Callable[[str], None] | None = None
"""Fault injection: called with the kind before each traced collective is issued (`--inject-hang
R:STEP:before-collective` hangs in it)."""
step_annotation: Callable[[], AbstractContextManager[Any]] | None = None


def current_recorder() -> CommRecorder | None:
    """The recorder `active` set; None outside a recorded step."""
    return _recorder


def inside_traced_call() -> bool:
    """Inside a traced call (or `untraced`): a collective issued now is not recorded again."""
    return getattr(_state, "inside", False)


def on_training_thread() -> bool:
    return threading.get_ident() == _training_thread


def on_compute_stream(stream: Any) -> bool:
    """On the training thread and `stream` is its compute stream: a stall there is exposed time."""
    return on_training_thread() and _compute_stream is not None and stream == _compute_stream


def finish(recorder: CommRecorder, handle: int) -> None:
    """Close a host-path collective (after the injected delay, if any)."""
    if comm_delay_s:
        time.sleep(comm_delay_s)
    recorder.end(handle)


def lane_of(group: Any) -> Any:
    """What a collective queues behind on the device: its process group's stream."""
    return "default" if group is None else id(group)


def device_start(tensor: torch.Tensor) -> Any:
    """A start event recorded on `tensor`'s current stream, or None on the host path."""
    if not device_timing.is_device_tensor(tensor):
        return None
    start = device_timing.event()
    start.record(device_timing.current_stream(tensor.device))
    return start


def device_end(recorder: CommRecorder, handle: int, start: Any, lane: Any, stream: Any = None) -> Any:
    """Record the end event and hand both events to the recorder; returns the end event. In a
    callback chained on the work's future it goes on the callback's stream, which c10 made wait
    for the work; after a blocking op, on the issuing `stream`, which waits for it too."""
    if comm_delay_s:
        time.sleep(comm_delay_s)
    end = device_timing.event()
    end.record(stream)
    recorder.end_device(handle, start, end, lane)
    return end


def _remember(works: list, device: Any, p2p: bool, handle: int) -> None:
    for w in works:
        _issued[id(w)] = (weakref.ref(w), device, p2p, handle)


def _wrap(name: str, fn: Callable[..., Any], kind: str, payload: Callable[[tuple, dict], Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is None or inside_traced_call():
            return fn(*args, **kwargs)
        group = argument(args, kwargs, _GROUP_POSITION.get(name, 99), "group")
        try:
            group_size = dist.get_world_size(group)
        except Exception:  # noqa: BLE001 - not a member, or no default group: size unknown
            group_size = 0
        tensors = payload(args, kwargs)
        if before_issue is not None:
            before_issue(kind)
        handle = recorder.begin(kind, nbytes(tensors), group_size,
                                "p2p" if kind == "p2p" else group_name(group), shapes_digest(tensors))
        if getattr(recorder, "end_device", None) is not None:
            tensor = first_tensor(tensors)
            if tensor is not None and device_timing.is_device_tensor(tensor):
                return _traced_on_device(fn, args, kwargs, recorder, handle, kind, group, tensor)
        t0 = time.perf_counter_ns()
        result, works = _issue(fn, args, kwargs, recorder, handle)
        if works:
            _remember(works, None, kind == "p2p", handle)
            try:
                works[-1].get_future().then(lambda _f: finish(recorder, handle))
            except Exception:  # noqa: BLE001 - a backend without futures: count it as done when issued
                recorder.end(handle)
        else:
            finish(recorder, handle)
            if on_training_thread():
                recorder.blocked(t0, time.perf_counter_ns(), handle)
        return result

    traced.__ringtop_traced__ = True
    return traced


def _issue(fn: Callable[..., Any], args: tuple, kwargs: dict, recorder: Any, handle: int) -> tuple[Any, list]:
    """(fn's result, its works when it was issued asynchronously, else []); the collective is
    closed in the recorder if it raises."""
    _state.inside = True
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        recorder.end(handle)
        raise
    finally:
        _state.inside = False
    works = result if isinstance(result, list) else [result]
    return result, works if works and all(isinstance(w, dist.Work) for w in works) else []


def _traced_on_device(fn: Callable[..., Any], args: tuple, kwargs: dict, recorder: Any, handle: int, kind: str,
                      group: Any, tensor: torch.Tensor) -> Any:
    """The GPU path of `_wrap` (see the module docstring)."""
    stream = device_timing.current_stream(tensor.device)
    start = device_timing.event()
    start.record(stream)
    lane = None if kind == "p2p" else lane_of(group)  # NCCL runs p2p on per-peer streams
    result, works = _issue(fn, args, kwargs, recorder, handle)
    if works:
        _remember(works, tensor.device, kind == "p2p", handle)
        try:
            works[-1].get_future().then(functools.partial(_device_done, recorder, handle, start, lane))
        except Exception:  # noqa: BLE001 - a backend without futures: only the issue is known
            recorder.end(handle)
    else:  # blocking: the issuing stream now waits for the collective
        end = device_end(recorder, handle, start, lane, stream)
        if on_compute_stream(stream):
            recorder.blocked_device(start, end, kind == "p2p", handle)
    return result


def _device_done(recorder: Any, handle: int, start: Any, lane: Any, _fut: Any) -> None:
    device_end(recorder, handle, start, lane)


def _wrap_wait(wait: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(wait)
    def traced_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is None or not on_training_thread():
            return wait(self, *args, **kwargs)
        issued = _issued.get(id(self)) if _issued else None
        if issued is not None and issued[0]() is not self:
            issued = None
        if issued is not None and issued[1] is not None:  # a GPU work: wait() only makes the stream wait
            stream = device_timing.current_stream(issued[1])
            if _compute_stream is None or stream != _compute_stream:
                return wait(self, *args, **kwargs)  # a side stream waits: not the compute's stall
            before = device_timing.event()
            before.record(stream)
            try:
                return wait(self, *args, **kwargs)
            finally:
                after = device_timing.event()
                after.record(stream)
                recorder.blocked_device(before, after, issued[2], issued[3])
        t0 = time.perf_counter_ns()
        try:
            return wait(self, *args, **kwargs)
        finally:
            t1 = time.perf_counter_ns()
            handle = issued[3] if issued is not None else None
            if issued is not None and issued[2] and hasattr(recorder, "blocked_p2p"):
                recorder.blocked_p2p(t0, t1, handle)
            else:
                recorder.blocked(t0, t1, handle)

    traced_wait.__ringtop_traced__ = True
    return traced_wait


def install() -> None:
    """Wrap the functions (and `Work.wait`) once per process; idempotent."""
    global _installed
    with install_lock:
        if _installed:
            return
        for name, (kind, payload) in _OPS.items():
            fn = getattr(dist, name, None)
            if fn is not None and not getattr(fn, "__ringtop_traced__", False):
                setattr(dist, name, _wrap(name, fn, kind, payload))
        if not getattr(dist.Work.wait, "__ringtop_traced__", False):
            dist.Work.wait = _wrap_wait(dist.Work.wait)
        if "torch.distributed.pipelining.schedules" in sys.modules:
            trace_pipeline_p2p()
        _installed = True


def trace_pipeline_p2p() -> None:
    """torch.distributed.pipelining sends activations through its private `_batch_p2p`, which
    calls `isend`/`irecv` directly for one-way batches: wrap that helper to see them. Called by
    the pipeline strategy when it imports the schedules (importing them here would cost every
    rank's start-up 1.5 s of dynamo and DTensor), and by `install` if they are already in."""
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        return
    fn = getattr(schedules, "_batch_p2p", None)
    if fn is not None and not getattr(fn, "__ringtop_traced__", False):
        schedules._batch_p2p = _wrap("_batch_p2p", fn, "p2p",
                                     lambda a, k: [op.tensor for op in (argument(a, k, 0, "p2p_ops") or [])])



@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Collectives issued inside are not recorded: one its caller records itself (a comm hook)."""
    before = getattr(_state, "inside", False)
    _state.inside = True
    try:
        yield
    finally:
        _state.inside = before


@contextlib.contextmanager
def active(recorder: CommRecorder | None) -> Iterator[None]:
    """Record into `recorder` for the duration (typically one training step)."""
    global _recorder, _training_thread, _compute_stream
    annotate = step_annotation
    with annotate() if annotate is not None else contextlib.nullcontext():
        if recorder is None:
            yield
            return
        install()
        previous, _recorder = _recorder, recorder
        previous_thread, _training_thread = _training_thread, threading.get_ident()
        previous_stream = _compute_stream
        if previous is None:
            _compute_stream = device_timing.current_stream() if device_timing.in_use() else None
        try:
            yield
        finally:
            _recorder, _training_thread, _compute_stream = previous, previous_thread, previous_stream
            if previous is None:
                _issued.clear()
