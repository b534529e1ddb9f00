"""What DDP and FSDP share: a torch module and optimizer, clipping, byte counts, and the full
state read through `torch.distributed.checkpoint.state_dict` (so checkpoints are portable) and
written back by each rank copying its own part of it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ringtop.strategies.base import (
    CountsOwnTensors,
    ModelCall,
    Strategy,
    StrategyError,
    unique_parameters,
)


def _is_dtensor(value: Any) -> bool:
    """Without importing DTensor (a second of every rank's start-up): no module made one if
    `torch.distributed.tensor` was never imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def _state_dict_api():
    """torch.distributed.checkpoint.state_dict, imported when a state is first read (it pulls in
    DTensor and DCP: over a second of start-up a DDP run without a checkpoint never needs)."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _full_out():
    return _state_dict_api().StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass
class TorchNativeStrategy(CountsOwnTensors, Strategy):
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
        params = unique_parameters(self.model)
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if _is_dtensor(norm):  # FSDP: a partial sum of the shards' norms until reduced
            norm = norm.full_tensor()
        self._grad_norm = norm.detach()
        if self._skip_if_not_finite(norm):
            return  # parameters, moments and AdamW's step count untouched; the next step zeroes the gradients
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.settings.grad_clip, norm)
        self.optimizer.step()

    def _counted_module(self) -> nn.Module:
        return self.model

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        api, options = _state_dict_api(), _full_out()
        return (
            api.get_model_state_dict(self.model, options=options),
            api.get_optimizer_state_dict(self.model, self.optimizer, options=options),
        )

    def sharded_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        api = _state_dict_api()
        return api.get_model_state_dict(self.model), api.get_optimizer_state_dict(self.model, self.optimizer)

    def full_state_dict_on_every_rank(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each rank's own state with sharded tensors all-gathered: nothing is sent for replicated
        state (DDP), and nothing is funnelled through rank 0. Replicated tensors are returned as
        they are (no copy); gathered ones land on the CPU when they live on a GPU."""
        def full(value: Any) -> Any:
            if _is_dtensor(value):
                gathered = value.full_tensor()
                return gathered.cpu() if gathered.is_cuda else gathered
            if isinstance(value, torch.Tensor):
                return value.detach()
            if isinstance(value, dict):
                return {k: full(v) for k, v in value.items()}
            if isinstance(value, list):
                return [full(v) for v in value]
            return value

        api = _state_dict_api()
        return (full(api.get_model_state_dict(self.model)),
                full(api.get_optimizer_state_dict(self.model, self.optimizer)))

    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any], *,
                             weights_loaded: bool = False) -> None:
        """Each rank copies its own part of every full tensor (its shard of a DTensor, all of a
        replicated one) without communication, and builds the optimizer state directly instead
        of priming it with a throw-away step: several times faster than the state-dict API's
        scatter from rank 0 for the 125m model."""
        module = self._unwrapped()
        if not weights_loaded:
            targets = module.state_dict(keep_vars=True)
            missing = [name for name in targets if name not in model_state]
            if missing:
                raise StrategyError(f"the state lacks {len(missing)} tensor(s) of this model, e.g. {missing[:5]}")
            with torch.no_grad():
                for name, target in targets.items():
                    _local_part(target).copy_(_local_part(_laid_out_like(model_state[name], target)))
        self.optimizer.load_state_dict(_native_optimizer_state(module, self.optimizer, optim_state))

    def _unwrapped(self) -> nn.Module:
        """The module whose names the full state uses (DDP's wrapper adds `module.`)."""
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    def release_gradients(self) -> None:
        if self.model is not None:
            for p in self.model.parameters():
                p.grad = None

    def teardown(self) -> None:
        self.release_gradients()
        self.model = None
        self.optimizer = None


def _local_part(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def _laid_out_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` distributed as `like` is (each rank keeping its own shard, with no communication),
    or `full` itself on `like`'s device when `like` is a plain tensor."""
    full = full.to(like.device)
    if _is_dtensor(like):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full


def _native_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer,
                            optim_state: dict[str, Any]) -> dict[str, Any]:
    """The full, name-keyed optimizer state turned into `optimizer.state_dict()`'s own layout
    (parameters by position), each per-parameter tensor laid out like its parameter."""
    name_of = {id(p): name for name, p in module.named_parameters()}
    full_state = optim_state.get("state", {})
    saved_group_of = {name: g for g in optim_state.get("param_groups", []) for name in g.get("params", [])}
    state: dict[int, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    index = 0
    for group in optimizer.param_groups:
        saved_group: dict[str, Any] | None = None
        positions = []
        for param in group["params"]:
            name = name_of.get(id(param))
            if name is None:
                raise StrategyError("the optimizer holds a parameter that is not in the model")
            if name in full_state:
                state[index] = {key: _laid_out_like(value, param)
                                if isinstance(value, torch.Tensor) and value.shape == param.shape else value
                                for key, value in full_state[name].items()}
            saved_group = saved_group or saved_group_of.get(name)
            positions.append(index)
            index += 1
        hyper = {k: v for k, v in (saved_group or group).items() if k not in ("params", "param_names")}
        groups.append({**hyper, "params": positions})
    return {"state": state, "param_groups": groups}


def full_optimizer_template(model: nn.Module, make_optimizer) -> dict[str, Any]:
    """An optimizer state in the full layout, of the right shapes, for a checkpoint to be read into."""
    optimizer = make_optimizer(model.parameters())
    api = _state_dict_api()
    return api.get_optimizer_state_dict(model, optimizer, options=api.StateDictOptions(full_state_dict=True))
