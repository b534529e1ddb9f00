"""Build the model and the data from the built-in defaults or from a user's `package.module:function`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class FactoryError(RuntimeError):
    """A user factory could not be found, failed, or returned something ringtop cannot train."""


@dataclass(frozen=True)
class BuildContext:
    """What a user's model or data factory may want to know. Factories take it or take nothing."""

    rank: int
    world_size: int
    batch_size: int
    seq_len: int
    seed: int
    start_step: int
    device: torch.device
    samples_seen: int = 0
    """Samples of the global stream consumed before `start_step` (resume here)."""


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise FactoryError(f"--{what} {spec!r}: expected package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise FactoryError(f"--{what} {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FactoryError(f"--{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"--{what} {spec!r}: {attr!r} is not callable")
    return obj


def call_factory(fn: Callable[..., Any], ctx: BuildContext, spec: str, what: str) -> Any:
    try:
        takes_ctx = any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
            for p in inspect.signature(fn).parameters.values()
        )
    except (TypeError, ValueError):
        takes_ctx = True
    try:
        return fn(ctx) if takes_ctx else fn()
    except Exception as exc:
        raise FactoryError(f"--{what} {spec!r} raised {type(exc).__name__}: {exc}") from exc


class ModuleWithLoss(nn.Module):
    """Turns a (module, loss_fn) pair into one module whose forward returns the loss."""

    def __init__(self, module: nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor]):
        super().__init__()
        self.module = module
        self.loss_fn = loss_fn

    def forward(self, inputs: Any, targets: Any) -> torch.Tensor:
        return self.loss_fn(self.module(inputs), targets)


def user_model(spec: str, ctx: BuildContext) -> nn.Module:
    built = call_factory(load_callable(spec, "model"), ctx, spec, "model")
    if isinstance(built, nn.Module):
        return built
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module) and callable(built[1]):
        return ModuleWithLoss(*built)
    raise FactoryError(
        f"--model {spec!r} returned {type(built).__name__}; expected an nn.Module whose forward returns "
        "a loss, or a tuple (module, loss_fn)"
    )


def user_data(spec: str, ctx: BuildContext) -> Iterable[Any]:
    built = call_factory(load_callable(spec, "data"), ctx, spec, "data")
    try:
        return iter(built)
    except TypeError:
        raise FactoryError(f"--data {spec!r} returned {type(built).__name__}, which is not iterable") from None


def call_model(model: nn.Module, batch: Any) -> torch.Tensor:
    """Batches are (inputs, targets) tuples, dicts of keyword arguments, or a single tensor."""
    if isinstance(batch, dict):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(*batch)
    else:
        out = model(batch)
    return loss_of(out)


def loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    elif not isinstance(out, torch.Tensor) and hasattr(out, "loss"):
        out = out.loss
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        raise FactoryError(
            f"the model returned {type(out).__name__}; ringtop needs a scalar loss tensor "
            "(or a dict / object with a `loss`, or pass (module, loss_fn) from --model)"
        )
    return out


def batch_to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: batch_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(batch_to(v, device) for v in batch)
    return batch


def batch_tokens(batch: Any) -> int:
    """Tokens for tokens/s: the element count of the first tensor (the inputs)."""
    if isinstance(batch, torch.Tensor):
        return batch.numel()
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        values = list(batch)
    else:
        return 0
    return next((v.numel() for v in values if isinstance(v, torch.Tensor)), 0)
