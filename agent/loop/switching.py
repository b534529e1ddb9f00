"""Live strategy switch at a step boundary, in the same processes, with rollback.

Every rank: build the new strategy object (options, availability) and agree that all could; take
the full training state from the old wrapping onto every rank (as it is where it is replicated,
all-gathered where it is sharded, else rank 0's copy broadcast over the gloo control group);
build the model anew on the meta device and give it that state's tensors (or let the strategy
allocate its own shards and copy them in), wrap it, load the optimizer state; agree that all ranks
succeeded. Only then is the old wrapping torn down. If any rank fails before then, every rank
discards the new wrapping and keeps training with the old one, whose state was never changed.
What the new strategy has left to write after that agreement (`stage_full_state_dict`) only
copies into memory it already holds; it runs once the old state has been let go of (and the heap
trimmed), so the new memory is first touched in pages just freed. The new model may share
tensors with the old wrapping (from DDP nothing is copied); no training step writes to them before
the switch has succeeded, and no start-up broadcast does either (every rank holds the same state,
so wrappers are told to skip it: `weights_identical`). DDP gives up its wrapper (the gradient
buckets) before the new one is built and wraps its module again if the switch is rolled back.
The data position is the step counter and the RNG is the process's own, so both carry over as is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtop.agent.loop.heap import trim_heap
from ringtop.strategies import collective_naming
from ringtop.strategies.base import DistContext, OptimizerFactory, Strategy, TrainSettings
from ringtop.strategies.registry import build_strategy


class SwitchError(RuntimeError):
    """The switch did not happen; training continues with the old strategy, state intact."""


class SwitchAborted(RuntimeError):
    """Writing the state failed after the old strategy was let go: nothing is left to train with.
    Only a bug gets here; every check and allocation happens before that point."""


class InjectedFailure(torch.OutOfMemoryError):
    """Raised on purpose (`--inject-fail-setup`) to prove the rollback."""


def all_ranks_ok(ok: bool, group: dist.ProcessGroup | None) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if group is not None:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def full_state_everywhere(strategy: Strategy, rank: int, group: dist.ProcessGroup | None
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full (model, optimizer) state on every rank: gathered by every rank where the strategy
    can (nothing moves for replicated state), else rank 0's copy sent to the others."""
    if group is None:
        return strategy.full_state_dict()
    state = strategy.full_state_dict_on_every_rank()
    if state is not None:
        return state
    state = strategy.full_state_dict()  # collective; complete on rank 0
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


def new_model(strategy: Strategy, build_model: Callable[[], nn.Module], state: dict[str, Any],
              device: torch.device) -> tuple[nn.Module, bool]:
    """(a new model for `strategy`, whether it already holds `state`). Built on the meta device,
    so no time goes into initialising weights that are overwritten at once (2-6 s for the 125m
    model); left there for a strategy that allocates only its own shards itself, else handed the
    state's tensors."""
    model = _built_on_meta(build_model, state)
    if model is not None and strategy.takes_meta_model:
        return model, False
    return model_holding(build_model, state, device, model), True


def model_holding(build_model: Callable[[], nn.Module], state: dict[str, Any], device: torch.device,
                  on_meta: nn.Module | None = None) -> nn.Module:
    """A model on `device` whose parameters and buffers are `state`'s tensors (no copy where they
    already are on `device`). A model that cannot be built on meta, or has buffers a state dict
    does not carry, is built for real and the state copied in."""
    model = on_meta if on_meta is not None else _built_on_meta(build_model, state)
    if model is None:
        model = build_model()
        model.load_state_dict(state)
        return model.to(device)
    names_by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(name)
    model.load_state_dict(state, assign=True)
    for names in names_by_param.values():  # assigning unties shared parameters: tie them again
        shared = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, shared)
    return model.to(device)


def _built_on_meta(build_model: Callable[[], nn.Module], state: dict[str, Any]) -> nn.Module | None:
    try:
        with torch.device("meta"):
            model = build_model()
    except Exception:
        return None
    return model if _state_covers(model, state) else None


def _state_covers(model: nn.Module, state: dict[str, Any]) -> bool:
    """Every parameter and buffer of `model` gets its value from `state` (non-persistent buffers
    are not in a state dict, so they would be left uninitialised)."""
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    names |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    return names <= state.keys()


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
    current.release_gradients()
    trim_heap()
    ok = True
    try:
        if inject_fail == name:
            raise InjectedFailure(f"injected failure while wrapping for {name}")
        model, weights_loaded = new_model(new, build_model, model_state, ctx.device)
        new.weights_identical = True
        collective_naming.name_mesh_dimensions(None)  # the old strategy's groups: the new one names its own
        new.setup(model, make_optimizer, ctx, settings)
        finish_load = new.stage_full_state_dict(model_state, optim_state, weights_loaded=weights_loaded)
    except Exception as exc:
        ok, reason = False, f"{type(exc).__name__}: {exc}"
    if not all_ranks_ok(ok, group):
        try:
            new.teardown()
        except Exception:
            pass
        raise SwitchError(f"switch to {name} failed and was rolled back: {reason or 'another rank failed'}")
    current.teardown()
    del model_state  # the old weights go now, before the rest of the state is written
    trim_heap()
    try:
        finish_load()
    except Exception as exc:
        raise SwitchAborted(f"switch to {name} failed after the old strategy was let go "
                            f"({type(exc).__name__}: {exc}); the state is lost, resume from a checkpoint") from exc
    return new, time.perf_counter() - t0
