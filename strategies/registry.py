"""Strategies by name. Adding a strategy is adding a module and a line here."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ringtop.strategies.base import Strategy, StrategyError

_STRATEGIES: dict[str, str] = {
    "ddp": "ringtop.strategies.ddp:DDPStrategy",
    "zero1": "ringtop.strategies.zero:Zero1Strategy",
    "zero2": "ringtop.strategies.zero:Zero2Strategy",
    "zero3": "ringtop.strategies.zero:Zero3Strategy",
    "fsdp": "ringtop.strategies.fsdp:FSDPStrategy",
    "pp": "ringtop.strategies.pipeline:PipelineStrategy",
    "tp": "ringtop.strategies.tensor_parallel:TensorParallelStrategy",
}


def strategy_names() -> list[str]:
    return list(_STRATEGIES)


def strategy_class(name: str) -> type[Strategy]:
    target = _STRATEGIES.get(name)
    if target is None:
        raise StrategyError(f"unknown strategy {name!r}; available: {', '.join(_STRATEGIES)}")
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def build_strategy(name: str, options: dict[str, Any], device: torch.device) -> Strategy:
    cls = strategy_class(name)
    reason = cls.unavailable_reason(device)
    if reason:
        raise StrategyError(f"strategy {name!r} cannot run here: {reason}")
    return cls(options=dict(options))
