"""The one small interface every parallel strategy implements.

A strategy wraps a model and its optimizer for one process group, runs a training step in phases
the runner can time, moves the full training state in and out (so checkpoints and, later, live
switches work across strategies), and says what it shards and how many bytes this rank holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from ringtop.strategies.grad_norm import GradNormGuard
from ringtop.strategies.state_dicts import StateDicts


class StrategyError(RuntimeError):
    """A strategy cannot be used as asked: unknown, unavailable here, or given bad options."""


@dataclass(frozen=True)
class ShardingSpec:
    params: bool = False
    grads: bool = False
    optimizer: bool = False


@dataclass(frozen=True)
class HeldBytes:
    """State bytes this rank holds, counted from the tensors it actually owns."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


class CommRecorder(Protocol):
    """Where strategies report the collectives they issue (implemented by the agent's tracer)."""

    def begin(self, kind: str, nbytes: int, group_size: int, group: str = "world", shapes: str = "") -> int:
        """A collective of `kind` is issued on the process group named `group` (by its ranks);
        `shapes`: a digest of its tensors' shapes. Returns the handle its end is reported with."""

    def end(self, handle: int) -> None: ...

    def blocked(self, start_ns: int, end_ns: int, handle: int | None = None) -> None:
        """The training thread waited on communication from `start_ns` to `end_ns` (perf_counter);
        `handle`: on the collective `begin` handed out, where known."""

    def blocked_p2p(self, start_ns: int, end_ns: int, handle: int | None = None) -> None:
        """The training thread waited on a point-to-point transfer (a pipeline's bubble, mostly)."""

    def end_device(self, handle: int, start_event: Any, end_event: Any, lane: Any = None) -> None:
        """GPU: the collective ran between two CUDA events, read later without synchronising."""

    def blocked_device(self, start_event: Any, end_event: Any, p2p: bool = False, handle: int | None = None) -> None:
        """GPU: the compute stream stalled on communication between two CUDA events (on `handle`'s)."""


class PhaseMarker(Protocol):
    def mark(self, phase: str) -> None: ...


OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
ModelCall = Callable[[nn.Module, Any], torch.Tensor]

DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class TrainSettings:
    """What every strategy must apply the same way, so strategies stay comparable."""

    batch_size: int
    """Per rank, per step."""
    grad_clip: float = 0.0
    """Max global gradient norm; 0 = no clipping."""
    dtype: str = "fp32"
    """Compute dtype: fp32, or bf16 mixed precision (fp32 master state)."""
    skip_nonfinite: bool = False
    """Leave out the optimizer step of a step whose global gradient norm is not finite, so
    parameters and optimizer state stay exactly as they were. Costs one device->host read of the
    norm per step on a GPU. DeepSpeed steps inside its engine and ignores it."""


@dataclass
class Strategy(GradNormGuard, StateDicts, ABC):
    """Subclasses set `name` and `sharding`, build their wrapping in `setup`, and implement the
    step's parts and the byte counts; `run_step` strings the parts together the same way for all.
    The state handed out and taken in (checkpoints, switches) is `StateDicts`; the gradient norm,
    its skip and the NaN injection are `GradNormGuard`."""

    name: ClassVar[str]
    sharding: ClassVar[ShardingSpec]
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.settings = TrainSettings(batch_size=1)
        self._recorder: CommRecorder | None = None
        self._measure_next = True
        self._held = HeldBytes()
        self._grads_bytes = 0
        self._grad_norm: Any = None
        self._grad_norm_host: float | None = None
        self._skipped = False
        self._inject_nan = False
        self.weights_identical = False
        """Set by a caller that loaded one full state into the model on every rank: wrappers may
        skip their start-up broadcast of the weights (DDP's 0.5 GB for the 125m model)."""
        self.stage_index = 0
        self.num_stages = 1
        """A strategy that splits the model into stages (a pipeline) sets these in `setup`; any
        other is one stage: each rank holds the whole model and does all of a step's work."""
        self.work_split = 1
        """Ranks that split each layer's work on the same batch (tensor parallelism sets its degree):
        a rank's share of the tokens it counts, as a stage's."""

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """Why this strategy cannot run on `device` in this environment, or None if it can."""
        return None

    def live_facts(self) -> dict[str, Any]:
        """What the Hello says about this strategy beyond its options, as it runs now (a pipeline's
        stages and micro-batches); nothing for most."""
        return {}

    def describe(self) -> str:
        """Name with the options that change behaviour, e.g. `fsdp(full)`."""
        return self.name

    def stage_size(self) -> tuple[int, int] | None:
        """(parameters, parameter tensors) of the stage this rank holds, counted in `setup` on the
        whole model, for a strategy whose ranks hold a stage each (a pipeline; its memory is
        predicted from that stage); None where a rank holds the whole model."""
        return None

    def last_bubble(self) -> Any:
        """A pipeline stage's idle time in the last step (a StageBubble); None without stages or
        before a step."""
        return None

    def last_timeline(self) -> list:
        """A pipeline stage's forward/backward events of the last step; none without stages."""
        return []

    def last_window_ns(self) -> tuple[int, int]:
        """(start_ns, end_ns) of a pipeline stage's last step."""
        return (0, 0)

    def data_shard(self, ctx: DistContext) -> tuple[int, int]:
        """(index, count) of the data shard this rank reads: its data-parallel position. Ranks that
        must see the same batch (pipeline stages of one replica) share an index."""
        return ctx.rank, ctx.world_size

    @abstractmethod
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext,
              settings: TrainSettings) -> None:
        """Wrap `model` (already on the right device, same weights on every rank) and build the optimizer."""

    def attach_comm_recorder(self, recorder: CommRecorder) -> None:
        """Default: record the collectives issued through torch.distributed's functions."""
        self._recorder = recorder

    def run_step(self, batch: Any, call_model: ModelCall, phases: PhaseMarker) -> torch.Tensor:
        """One optimizer step; marks 'forward', 'backward', 'optimizer' as each phase ends."""
        from ringtop.strategies import collective_hooks

        measure, self._measure_next = self._measure_next, False
        poison, self._inject_nan = self._inject_nan, False
        self._skipped, self._grad_norm_host = False, None
        with collective_hooks.active(self._recorder if self.traces_torch_collectives else None):
            self._zero_grad()
            loss = self._poisoned_forward(batch, call_model) if poison else self._forward(batch, call_model)
            phases.mark("forward")
            self._backward(loss)
            if measure:
                self._grads_bytes = self._count_grads()
            phases.mark("backward")
            self._optimizer_step()
            if measure:
                self._held = HeldBytes(self._count_params(), self._grads_bytes, self._count_optimizer())
            phases.mark("optimizer")
        return loss

    traces_torch_collectives: ClassVar[bool] = True

    takes_micro_batches: ClassVar[bool] = False
    """A step runs in `micro_batches`, which `set_micro_batches` changes between steps (a pipeline)."""

    takes_meta_model: ClassVar[bool] = False
    """`setup` accepts a model on the meta device and allocates only what this rank holds; its
    values then come from `load_full_state_dict` (parameters and persistent buffers)."""

    def held_bytes(self) -> HeldBytes:
        """Bytes measured on the last step that was asked to measure (`measure_next_step`):
        gradients right after backward, parameters and optimizer state right after the step."""
        return self._held

    def measure_next_step(self) -> None:
        self._measure_next = True

    @abstractmethod
    def _zero_grad(self) -> None: ...

    @abstractmethod
    def _forward(self, batch: Any, call_model: ModelCall) -> torch.Tensor: ...

    @abstractmethod
    def _backward(self, loss: torch.Tensor) -> None: ...

    @abstractmethod
    def _optimizer_step(self) -> None:
        """Clip to `settings.grad_clip` (if set) by the global norm, then step; keep the norm for
        `last_grad_norm`. With `settings.skip_nonfinite`, leave the step out when the norm is not
        finite (`_skip_if_not_finite`)."""

    @abstractmethod
    def _count_params(self) -> int: ...

    @abstractmethod
    def _count_grads(self) -> int: ...

    @abstractmethod
    def _count_optimizer(self) -> int: ...

    @abstractmethod
    def teardown(self) -> None: ...


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of distinct tensors (tied weights and repeated views count once). DTensors count
    their local shard."""
    seen: set[tuple[int, int, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        if local.numel() == 0:
            continue
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), local.numel())
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def unique_parameters(module: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in module.parameters()}.values())


def refuse_unknown_options(name: str, options: dict[str, Any], taken: tuple[str, ...]) -> None:
    """A strategy's constructor options beyond those it takes are a StrategyError naming both."""
    unknown = set(options) - set(taken)
    if unknown:
        says = " and ".join(taken) if len(taken) <= 2 else ", ".join(taken)
        raise StrategyError(f"{name} does not take option(s) {sorted(unknown)}; it takes {says}")


class CountsOwnTensors:
    """The `_count_*` hooks of a strategy whose module and optimizer hold its tensors as they are
    (each local, a DTensor by its shard): the bytes of `_counted_module()`'s parameters, their
    gradients and `self.optimizer`'s state."""

    def _counted_module(self) -> nn.Module:
        return self.module

    def _count_params(self) -> int:
        return tensor_bytes(unique_parameters(self._counted_module()))

    def _count_grads(self) -> int:
        return tensor_bytes(p.grad for p in unique_parameters(self._counted_module()))

    def _count_optimizer(self) -> int:
        return tensor_bytes(optimizer_state_tensors(self.optimizer))
