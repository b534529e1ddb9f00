"""A step's global gradient norm as a strategy reports it, the step left out when it is not finite,
and the NaN a fault injection plants. A part of `Strategy` (strategies/base.py), apart so the
interface reads in groups; `Strategy.run_step` and the strategies' `_optimizer_step` drive it."""

from __future__ import annotations

import math
from typing import Any

import torch


class GradNormGuard:
    _grad_norm: Any
    _grad_norm_host: float | None
    _skipped: bool
    _inject_nan: bool

    def last_grad_norm(self) -> Any:
        """The last step's global gradient norm before clipping (the tied weight once), as the
        strategy computed it: a tensor the caller reads once the step's work is done (no device
        synchronisation here), a float, or None where the strategy does not know it."""
        return self._grad_norm

    def grad_norm_on_host(self) -> float | None:
        """The last step's global norm as a float: the value `skip_nonfinite` already read, or read
        now (a device sync on a GPU, where the strategy did not read it: DeepSpeed)."""
        if self._grad_norm_host is not None:
            return self._grad_norm_host
        norm = self.last_grad_norm()
        return None if norm is None else float(norm)

    def last_step_skipped(self) -> bool:
        """The last step's optimizer step was left out (`skip_nonfinite`, a norm not finite)."""
        return self._skipped

    def inject_nan_next_step(self) -> None:
        """Fault injection: this rank's loss of the next step is NaN before backward."""
        self._inject_nan = True

    def _poisoned_forward(self, batch: Any, call_model: Any) -> torch.Tensor:
        """`_forward` with its loss made NaN; a strategy whose `_forward` also runs backward (a
        pipeline) poisons inside it."""
        return self._forward(batch, call_model) * float("nan")

    def _skip_if_not_finite(self, norm: torch.Tensor) -> bool:
        """With `settings.skip_nonfinite`: read the global norm (the one device->host sync this
        setting costs) and say whether to leave the optimizer step out. Call before clipping:
        clipping by a NaN norm would write NaN into the gradients (harmless once skipped, but
        the step must touch nothing)."""
        if not self.settings.skip_nonfinite:
            return False
        self._grad_norm_host = float(norm)
        self._skipped = not math.isfinite(self._grad_norm_host)
        return self._skipped
