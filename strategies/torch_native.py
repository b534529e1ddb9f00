"""What DDP and FSDP share: a torch module and optimizer, clipping, byte counts, and the full
state moved through `torch.distributed.checkpoint.state_dict` (so checkpoints are portable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .base import ModelCall, Strategy, optimizer_state_tensors, tensor_bytes, unique_parameters

_FULL_OUT = StateDictOptions(full_state_dict=True, cpu_offload=True)
_FULL_IN = StateDictOptions(full_state_dict=True)


@dataclass
class TorchNativeStrategy(Strategy):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _forward(self, batch: Any, call_model: ModelCall) -> torch.Tensor:
        return call_model(self.model, batch)

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _optimizer_step(self) -> None:
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()

    def _count_params(self) -> int:
        return tensor_bytes(unique_parameters(self.model))

    def _count_grads(self) -> int:
        return tensor_bytes(p.grad for p in unique_parameters(self.model))

    def _count_optimizer(self) -> int:
        return tensor_bytes(optimizer_state_tensors(self.optimizer))

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return (
            get_model_state_dict(self.model, options=_FULL_OUT),
            get_optimizer_state_dict(self.model, self.optimizer, options=_FULL_OUT),
        )

    def sharded_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return get_model_state_dict(self.model), get_optimizer_state_dict(self.model, self.optimizer)

    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
        # Separate calls (a combined set_state_dict hangs with broadcast_from_rank0); copies,
        # because the setters mutate what they are given.
        set_model_state_dict(self.model, dict(model_state), options=_FULL_IN)
        set_optimizer_state_dict(self.model, self.optimizer, _copy_optim(optim_state), options=_FULL_IN)

    def teardown(self) -> None:
        if self.model is not None:
            for p in self.model.parameters():
                p.grad = None
        self.model = None
        self.optimizer = None


def _copy_optim(optim_state: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": {k: dict(v) for k, v in optim_state.get("state", {}).items()},
        "param_groups": [dict(g) for g in optim_state.get("param_groups", [])],
    }


def full_optimizer_template(model: nn.Module, make_optimizer) -> dict[str, Any]:
    """An optimizer state in the full layout, of the right shapes, for a checkpoint to be read into."""
    optimizer = make_optimizer(model.parameters())
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
