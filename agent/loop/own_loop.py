"""A training loop ringtop does not own, seen through the Strategy interface the runner publishes
from: the user's DDP or FSDP2 model and optimizer, timed and measured by hooks that return nothing
and so change nothing the loop computes (forward hooks on the model, step hooks on the
optimizer; on DDP a comm hook that reduces exactly as DDP does without one)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ringtop.strategies.base import (
    CommRecorder,
    CountsOwnTensors,
    HeldBytes,
    PhaseMarker,
    ShardingSpec,
    Strategy,
)
from ringtop.strategies.ddp import register_traced_allreduce
from ringtop.strategies.fsdp import SHARDINGS

NOT_OWNED = "ringtop does not own this training loop (ringtop.Monitor)"


class MonitorError(TypeError):
    """What the Monitor was given cannot be watched; the message says what it takes."""


def loop_kind(model: nn.Module) -> tuple[str, nn.Module]:
    """('ddp' | 'fsdp', the module whose parameters are the model's) of a wrapped model."""
    if isinstance(model, DistributedDataParallel):
        return "ddp", model.module
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, FSDPModule):
        return "fsdp", model
    if isinstance(model, FullyShardedDataParallel):
        raise MonitorError("ringtop.Monitor watches FSDP2 (torch.distributed.fsdp.fully_shard), not the older "
                           "FullyShardedDataParallel wrapper")
    raise MonitorError(f"ringtop.Monitor watches a DistributedDataParallel model or an FSDP2 (fully_shard) one; "
                       f"got {type(model).__name__}: pass the model as your loop calls it, after wrapping")


class OwnLoop(CountsOwnTensors, Strategy):
    """The user's wrapping as it is. ringtop runs none of its step (`run_step`, state moves and
    switches are refused with the reason); it only listens."""

    sharding_of: ClassVar[dict[str, ShardingSpec]] = {"ddp": ShardingSpec(), **{f"fsdp-{k}": v
                                                                                 for k, v in SHARDINGS.items()}}

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, fsdp_sharding: str = "full") -> None:
        super().__init__(options={})
        self.kind, self.module = loop_kind(model)
        self.name = self.kind
        self.fsdp_sharding = fsdp_sharding
        self.model, self.optimizer = model, optimizer
        self.phases: PhaseMarker | None = None
        """The open step's marks; None between steps (an evaluation forward then marks nothing)."""
        self.recording = True
        self.comm_note = ""
        """Why some of the loop's traffic is not seen ("": all of it is)."""
        self.trainer = ""
        """The trainer whose callback made the Monitor (hf, lightning), "" for a script's own loop."""
        self._forwarded = False
        self._closure = False
        """The optimizer's step began before any forward: it runs forward and backward in a closure
        (Lightning's), so its update is counted in backward (no hook tells them apart)."""
        self._handles: list[Any] = []

    @property
    def sharding(self) -> ShardingSpec:  # type: ignore[override]
        return self.sharding_of["ddp" if self.kind == "ddp" else f"fsdp-{self.fsdp_sharding}"]

    def describe(self) -> str:
        return "ddp (own loop)" if self.kind == "ddp" else f"fsdp({self.fsdp_sharding}) (own loop)"

    def live_facts(self) -> dict[str, Any]:
        return {"loop": "own", **({"trainer": self.trainer} if self.trainer else {})}

    # ------------------------------------------------------------------ listening

    def listen(self) -> None:
        self._handles = [
            self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            self.model.register_forward_hook(self._after_forward),
            self.optimizer.register_step_pre_hook(self._before_optimizer),
            self.optimizer.register_step_post_hook(self._after_optimizer),
        ]

    def open_step(self, phases: PhaseMarker) -> None:
        self.phases, self._forwarded, self._closure = phases, False, False

    def close_step(self) -> None:
        self.phases = None

    def _mark(self, phase: str) -> None:
        if self.phases is not None and torch.is_grad_enabled():
            self.phases.mark(phase)

    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.phases is None or not torch.is_grad_enabled():
            return
        self._mark("backward" if self._forwarded else "data")  # a later micro-batch: since the last forward
        self._forwarded = True

    def _after_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._mark("forward")

    def _before_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not self._forwarded:
            self._closure = True  # the time so far is data; the forward comes inside the step
            return
        self._mark("backward")
        if self._measure_next and self.phases is not None:
            self._grads_bytes = self._count_grads()

    def _after_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._mark("backward" if self._closure else "optimizer")
        if self._measure_next and self.phases is not None:
            if self._closure:
                self._grads_bytes = self._count_grads()  # the gradients are still there after the step
            self._held = HeldBytes(self._count_params(), self._grads_bytes, self._count_optimizer())
            self._measure_next = False

    def attach_comm_recorder(self, recorder: CommRecorder) -> None:
        self._recorder = recorder
        if self.kind != "ddp":
            return  # FSDP2 calls torch.distributed's functions, which the tracer wraps
        try:
            register_traced_allreduce(self.model, recorder, like_builtin=True, recording=lambda: self.recording)
        except RuntimeError as exc:  # DDP takes one comm hook: the script registered its own
            self.comm_note = f"DDP's gradient all-reduce is not seen: the model has a comm hook of its own ({exc})"

    def set_grad_norm(self, norm: Any) -> None:
        self._grad_norm = norm.detach() if isinstance(norm, torch.Tensor) else norm

    # ------------------------------------------------------------------ not ringtop's to do

    def setup(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(NOT_OWNED)

    def run_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(NOT_OWNED)

    def _zero_grad(self) -> None:
        raise RuntimeError(NOT_OWNED)

    def _forward(self, batch: Any, call_model: Any) -> torch.Tensor:
        raise RuntimeError(NOT_OWNED)

    def _backward(self, loss: torch.Tensor) -> None:
        raise RuntimeError(NOT_OWNED)

    def _optimizer_step(self) -> None:
        raise RuntimeError(NOT_OWNED)

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        raise RuntimeError(f"{NOT_OWNED}: checkpoints go through the save function the script registers")

    def load_full_state_dict(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(NOT_OWNED)

    def teardown(self) -> None:
        """Hooks removed (DDP's comm hook cannot be: it stops recording and reduces as before)."""
        self.recording = False
        self.phases = None
        for handle in self._handles:
            handle.remove()
        self._handles = []
