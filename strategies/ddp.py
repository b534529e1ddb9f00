"""DistributedDataParallel: every rank holds everything; gradients are all-reduced in buckets."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ringtop.strategies import collective_hooks
from ringtop.strategies.base import (
    CommRecorder,
    DistContext,
    ModelCall,
    OptimizerFactory,
    ShardingSpec,
    StrategyError,
    TrainSettings,
    refuse_unknown_options,
)
from ringtop.strategies.torch_native import TorchNativeStrategy


@dataclass
class DDPStrategy(TorchNativeStrategy):
    name = "ddp"
    sharding = ShardingSpec()
    traces_torch_collectives = False  # the reducer bypasses torch.distributed's functions: a comm hook sees it

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_unknown_options(self.name, self.options, ("bucket_cap_mb",))
        cap = self.options.get("bucket_cap_mb")
        if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
            raise StrategyError(f"ddp bucket_cap_mb must be a positive number, got {cap!r}")

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext,
              settings: TrainSettings) -> None:
        if settings.dtype != "fp32":
            raise StrategyError("ddp trains in fp32 here; use --strategy fsdp or zero1/2/3 for --dtype bf16")
        self.settings = settings
        kwargs: dict[str, Any] = {}
        if self.options.get("bucket_cap_mb") is not None:
            kwargs["bucket_cap_mb"] = float(self.options["bucket_cap_mb"])
        self._device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self._ddp_kwargs = kwargs
        self.model = DistributedDataParallel(model, device_ids=self._device_ids, init_sync=not self.weights_identical,
                                             **kwargs)
        self.optimizer = make_optimizer(self.model.parameters())

    def release_gradients(self) -> None:
        """Also drops the wrapper: its reducer keeps a second copy of every gradient in its buckets
        (0.5 GB for the 125m model), memory a switch then builds the new wrapping in. The module and
        the optimizer stay; the next step wraps the module again (after a rolled-back switch)."""
        super().release_gradients()
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.model.module

    def _forward(self, batch: Any, call_model: ModelCall) -> torch.Tensor:
        if not isinstance(self.model, DistributedDataParallel):
            self.model = DistributedDataParallel(self.model, device_ids=self._device_ids, init_sync=False,
                                                 **self._ddp_kwargs)
            if self._recorder is not None:
                self._register_traced_hook(self._recorder)
        return super()._forward(batch, call_model)

    def attach_comm_recorder(self, recorder: CommRecorder) -> None:
        super().attach_comm_recorder(recorder)
        self._register_traced_hook(recorder)

    def _register_traced_hook(self, recorder: CommRecorder) -> None:
        register_traced_allreduce(self.model, recorder)


def _builtin_allreduce(group: Any, bucket: Any) -> torch.futures.Future:
    """What DDP's C++ reducer does without a hook, operation for operation: each gradient times
    1/N (the reducer scales as it copies into the bucket), then a sum. torch's Python
    `allreduce_hook` divides by N instead, which rounds differently for N not a power of two."""
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])


def register_traced_allreduce(model: DistributedDataParallel, recorder: CommRecorder, like_builtin: bool = False,
                              recording: Callable[[], bool] | None = None) -> None:
    """Wrap DDP's all-reduce in a comm hook so each bucket's bytes and completion time are recorded.

    `like_builtin`: reduce exactly as DDP does with no hook (a user's own loop must compute what it
    computed unwatched); else torch's default Python hook (the strategy's, since its start).
    `recording()` False: reduce without recording (a watch that has ended; a hook cannot be removed).

    On gloo the future completes when the all-reduce has finished: its host time is the
    completion. On NCCL it completes once the work is enqueued, so for CUDA buckets (when the
    recorder takes device records) a CUDA event recorded before the issue and one recorded in
    the future's callback, whose stream c10 makes wait for the all-reduce, time it on the device
    (`collective_hooks.device_start` / `device_end`), read later without synchronising.
    """
    group = dist.group.WORLD
    group_size = dist.get_world_size()
    lane = collective_hooks.lane_of(group)
    name = collective_hooks.group_name(group)
    device = getattr(recorder, "end_device", None) is not None
    reduce = _builtin_allreduce if like_builtin else default_hooks.allreduce_hook

    def traced_allreduce(state, bucket):  # DDP rejects string annotations (this module has postponed ones)
        if recording is not None and not recording():
            with collective_hooks.untraced():
                return reduce(group, bucket)
        buffer = bucket.buffer()
        if collective_hooks.before_issue is not None:
            collective_hooks.before_issue("all_reduce")
        handle = recorder.begin("all_reduce", buffer.numel() * buffer.element_size(), group_size, name,
                                collective_hooks.shapes_digest(buffer))
        start = collective_hooks.device_start(buffer) if device else None
        with collective_hooks.untraced():  # recorded here, once, whoever records torch.distributed's calls
            fut = reduce(group, bucket)

        def finished(f):
            if start is not None:
                collective_hooks.device_end(recorder, handle, start, lane)
            else:
                if collective_hooks.comm_delay_s:
                    time.sleep(collective_hooks.comm_delay_s)
                recorder.end(handle)
            return f.value()

        return fut.then(finished)

    model.register_comm_hook(None, traced_allreduce)
