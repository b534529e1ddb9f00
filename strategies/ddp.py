"""DistributedDataParallel: every rank holds everything; gradients are all-reduced in buckets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from .base import (
    CommRecorder,
    DistContext,
    HeldBytes,
    ModelCall,
    OptimizerFactory,
    PhaseMarker,
    ShardingSpec,
    Strategy,
    StrategyError,
    optimizer_state_tensors,
    tensor_bytes,
)

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class DDPStrategy(Strategy):
    name = "ddp"
    sharding = ShardingSpec()

    def __post_init__(self) -> None:
        unknown = set(self.options) - {"bucket_cap_mb"}
        if unknown:
            raise StrategyError(f"ddp does not take option(s) {sorted(unknown)}; it takes bucket_cap_mb")
        cap = self.options.get("bucket_cap_mb")
        if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
            raise StrategyError(f"ddp bucket_cap_mb must be a positive number, got {cap!r}")
        self.model: DistributedDataParallel | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext) -> None:
        kwargs: dict[str, Any] = {}
        if self.options.get("bucket_cap_mb") is not None:
            kwargs["bucket_cap_mb"] = float(self.options["bucket_cap_mb"])
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids, **kwargs)
        self.optimizer = make_optimizer(self.model.parameters())

    def attach_comm_recorder(self, recorder: CommRecorder) -> None:
        """Wrap the default all-reduce hook so each bucket's bytes and completion time are recorded.

        On gloo the future completes when the all-reduce has finished; on NCCL it completes once the
        work is enqueued, so GPU timings here are issue-side only.
        """
        assert self.model is not None
        group = dist.group.WORLD
        group_size = dist.get_world_size()

        def traced_allreduce(state, bucket):  # DDP rejects string annotations (this module has postponed ones)
            buffer = bucket.buffer()
            handle = recorder.begin("all_reduce", buffer.numel() * buffer.element_size(), group_size)
            fut = default_hooks.allreduce_hook(group, bucket)

            def finished(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                recorder.end(handle)
                return f.value()

            return fut.then(finished)

        self.model.register_comm_hook(None, traced_allreduce)

    def run_step(self, batch: Any, call_model: ModelCall, phases: PhaseMarker) -> torch.Tensor:
        assert self.model is not None and self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = call_model(self.model, batch)
        phases.mark("forward")
        loss.backward()
        phases.mark("backward")
        self.optimizer.step()
        phases.mark("optimizer")
        return loss

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        assert self.model is not None and self.optimizer is not None
        return (
            get_model_state_dict(self.model, options=_FULL),
            get_optimizer_state_dict(self.model, self.optimizer, options=_FULL),
        )

    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
        assert self.model is not None and self.optimizer is not None
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, dict(model_state), options=options)
        set_optimizer_state_dict(self.model, self.optimizer, dict(optim_state), options=options)

    def held_bytes(self) -> HeldBytes:
        assert self.model is not None and self.optimizer is not None
        params = list(self.model.parameters())
        return HeldBytes(
            params=tensor_bytes(params),
            grads=tensor_bytes(p.grad for p in params),
            optimizer=tensor_bytes(optimizer_state_tensors(self.optimizer)),
        )

    def teardown(self) -> None:
        self.model = None
        self.optimizer = None
