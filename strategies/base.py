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

    def begin(self, kind: str, nbytes: int, group_size: int) -> int: ...

    def end(self, handle: int) -> None: ...


class PhaseMarker(Protocol):
    def mark(self, phase: str) -> None: ...


OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
ModelCall = Callable[[nn.Module, Any], torch.Tensor]


@dataclass
class Strategy(ABC):
    """Subclasses set `name` and `sharding` and implement the abstract methods."""

    name: ClassVar[str]
    sharding: ClassVar[ShardingSpec]
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """Why this strategy cannot run on `device` in this environment, or None if it can."""
        return None

    @abstractmethod
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext) -> None:
        """Wrap `model` (already on the right device, same weights on every rank) and build the optimizer."""

    @abstractmethod
    def attach_comm_recorder(self, recorder: CommRecorder) -> None: ...

    @abstractmethod
    def run_step(self, batch: Any, call_model: ModelCall, phases: PhaseMarker) -> torch.Tensor:
        """One optimizer step; marks 'forward', 'backward', 'optimizer' as each phase ends; returns the loss."""

    @abstractmethod
    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state with fully qualified names, unsharded, on CPU. Collective: every
        rank calls it; rank 0's result is complete."""

    @abstractmethod
    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
        """Inverse of `full_state_dict`; every rank passes the same full state."""

    @abstractmethod
    def held_bytes(self) -> HeldBytes: ...

    @abstractmethod
    def teardown(self) -> None: ...


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of distinct tensor storages (tied weights and views count once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value
