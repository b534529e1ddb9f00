"""The state a strategy hands out and takes in: full and sharded checkpoints, a live switch's
transfer, a resume. A part of `Strategy` (strategies/base.py), apart so the interface reads in groups."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable


class StateDicts(ABC):
    @abstractmethod
    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state with fully qualified names, unsharded, on CPU, in the layout of
        `torch.distributed.checkpoint.state_dict`'s full state dicts. Collective: every rank calls
        it; rank 0's result is complete."""

    def sharded_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state for a sharded checkpoint, with the same names as the full one:
        what each rank holds (DTensors for sharded state) for `torch.distributed.checkpoint` to
        write in parallel. Default: the full state, which must then be complete on every rank."""
        return self.full_state_dict()

    def full_state_dict_on_every_rank(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The full state complete on every rank, for strategies that can produce it without
        going through rank 0 (replicated state costs nothing); None: use `full_state_dict` and
        send rank 0's copy. Tensors may alias the live state: read them, never write them."""
        return None

    @abstractmethod
    def load_full_state_dict(
        self, model_state: dict[str, Any], optim_state: dict[str, Any], *, weights_loaded: bool = False
    ) -> None:
        """Inverse of `full_state_dict`; every rank passes the same full state, which the strategy
        may keep (its tensors can become the optimizer state) or consume: pass a copy to keep
        using it.
        `weights_loaded`: the module given to `setup` already held these weights (a strategy may
        then skip them)."""

    def stage_full_state_dict(
        self, model_state: dict[str, Any], optim_state: dict[str, Any], *, weights_loaded: bool = False
    ) -> Callable[[], None]:
        """`load_full_state_dict` in two parts, for a switch: this call does everything that can
        fail (checks, allocation); the call it returns only writes, and runs once the old strategy
        has let go of its state, so a strategy can first touch its new memory then, in pages just
        freed (fresh pages fault in several times slower on a VM). Default: all of it now."""
        self.load_full_state_dict(model_state, optim_state, weights_loaded=weights_loaded)
        return lambda: None

    def release_gradients(self) -> None:
        """Drop the last step's gradients (the next step recomputes them): a switch then builds the
        new wrapping in memory the old one no longer needs. Default: keep them (DeepSpeed and the
        pipeline hold theirs inside their own engines)."""
        return None
