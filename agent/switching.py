"""Live strategy switch at a step boundary, in the same processes, with rollback.

Every rank: build the new strategy object (options, availability) and agree that all could; take
the full training state from the old wrapping (gathered to rank 0, then broadcast over the gloo
control group); wrap a freshly built model with the new strategy and load that state; agree that
all ranks succeeded. Only then is the old wrapping torn down. If any rank fails at any point, every
rank discards the new wrapping and keeps training with the old one, whose state was never touched.
The data position is the step counter and the RNG is the process's own, so both carry over as is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtop.strategies.base import DistContext, OptimizerFactory, Strategy, TrainSettings
from ringtop.strategies.registry import build_strategy


class SwitchError(RuntimeError):
    """The switch did not happen; training continues with the old strategy, state intact."""


class InjectedFailure(torch.OutOfMemoryError):
    """Raised on purpose (`--inject-fail-setup`) to prove the rollback."""


def all_ranks_ok(ok: bool, group: dist.ProcessGroup | None) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if group is not None:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def full_state_everywhere(strategy: Strategy, rank: int, group: dist.ProcessGroup | None
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full (model, optimizer) state on every rank, on CPU."""
    state = strategy.full_state_dict()
    if group is None:
        return state
    return broadcast_state(state if rank == 0 else None, rank, group)


def broadcast_state(state: Any, rank: int, group: dist.ProcessGroup) -> Any:
    """Rank 0's nested state on every rank: the structure pickled (small), each tensor sent as a
    tensor (pickling a large state instead is an order of magnitude slower)."""
    tensors: list[torch.Tensor] = []

    def strip(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj.detach().cpu().contiguous())
            return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(strip(v) for v in obj)
        return obj

    box = [strip(state) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    skeleton = box[0]

    def fill(obj: Any) -> Any:
        if isinstance(obj, _TensorSlot):
            t = tensors[obj.index] if rank == 0 else torch.empty(obj.shape, dtype=obj.dtype)
            dist.broadcast(t, src=0, group=group)
            return t
        if isinstance(obj, dict):
            return {k: fill(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(fill(v) for v in obj)
        return obj

    return fill(skeleton)


class _TensorSlot:
    """Where a tensor stood in a broadcast state (its shape and dtype travel with the structure)."""

    def __init__(self, index: int, shape: tuple[int, ...], dtype: torch.dtype):
        self.index, self.shape, self.dtype = index, shape, dtype


def switch_strategy(
    current: Strategy,
    name: str,
    options: Callable[[], dict[str, Any]],
    ctx: DistContext,
    group: dist.ProcessGroup | None,
    build_model: Callable[[], nn.Module],
    make_optimizer: OptimizerFactory,
    settings: TrainSettings,
    inject_fail: str | None = None,
) -> tuple[Strategy, float]:
    """(the new strategy, seconds taken); raises SwitchError after rolling back."""
    t0 = time.perf_counter()
    reason = ""
    new: Strategy | None = None
    try:
        new = build_strategy(name, options(), ctx.device)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    if not all_ranks_ok(new is not None, group):
        raise SwitchError(f"cannot switch to {name}: {reason or 'another rank could not build it'}")
    model_state, optim_state = full_state_everywhere(current, ctx.rank, group)
    ok = True
    try:
        if inject_fail == name:
            raise InjectedFailure(f"injected failure while wrapping for {name}")
        model = build_model()
        model.load_state_dict(model_state)  # weights in before wrapping: some wrappers copy them at init
        new.setup(model.to(ctx.device), make_optimizer, ctx, settings)
        new.load_full_state_dict(model_state, optim_state)
    except Exception as exc:
        ok, reason = False, f"{type(exc).__name__}: {exc}"
    if not all_ranks_ok(ok, group):
        try:
            new.teardown()
        except Exception:
            pass
        raise SwitchError(f"switch to {name} failed and was rolled back: {reason or 'another rank failed'}")
    current.teardown()
    return new, time.perf_counter() - t0
