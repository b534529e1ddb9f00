"""`--on-nonfinite`: what a run does at a step whose global gradient norm is not finite, and how
it names the ranks whose loss was not finite.

The signal is the global gradient norm every strategy already computes for clipping: one number,
the same on every rank (a NaN or inf loss on one rank reaches every rank's gradients through the
gradient all-reduce), so deciding costs no collective. Naming the ranks does: on such a step,
which is rare, every rank contributes one byte, "my own loss was finite", over a gloo group (CPU
tensors: no device sync).

- `warn` (the default) adds nothing to a step: the norm is read when the step is published, on a
  GPU a step or two late and not at the same loop iteration on every rank. So the gather cannot go
  on the control group, whose collectives must come in the same order everywhere; it is posted
  asynchronously on a gloo group of its own (`AsyncNaming`), whose only collectives are these
  gathers, posted in step order on every rank. The event follows once every rank has posted.
- `skip-step`, `stop`, `checkpoint-and-stop`: the strategy reads the norm to the host before its
  optimizer step (one device->host sync per step on a GPU; only these modes pay it) and leaves
  the step out when it is not finite, so parameters and optimizer state stay exactly as they
  were. Every rank then knows at the same point of the loop, and the naming is one blocking
  gather on the control group there. DeepSpeed ZeRO steps inside its engine: ringtop cannot leave
  its step out, so `skip-step` and `checkpoint-and-stop` are refused with it and `stop` acts after
  the step.

A run stopped by `stop` or `checkpoint-and-stop` says Bye with ok=False and each rank exits with
`EXIT_STOPPED` (through torchrun: 1), so a script around it does not carry on with a model that
diverged.

torch is imported where a gather needs it: the config (torch-free, for `ringtop run --help`)
imports the modes from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ringtop.metrics.strategy_names import ZERO_STRATEGIES

MODES = ("warn", "skip-step", "stop", "checkpoint-and-stop")
SKIPPING = frozenset({"skip-step", "stop", "checkpoint-and-stop"})
"""The modes whose strategy reads the norm before the optimizer step and leaves the step out."""
STOPPING = frozenset({"stop", "checkpoint-and-stop"})
NEEDS_OWN_STEP = ("skip-step", "checkpoint-and-stop")
"""The modes that need ringtop to take the optimizer step itself (not DeepSpeed's engine)."""
EXIT_STOPPED = 3
"""A rank's exit status after `stop` or `checkpoint-and-stop` ended the run."""


def zero_refusal(strategy: str, mode: str) -> str | None:
    """Why `mode` cannot be used with `strategy`, or None when it can."""
    if strategy not in ZERO_STRATEGIES or mode not in NEEDS_OWN_STEP:
        return None
    return (f"--on-nonfinite {mode} leaves the optimizer step out, but DeepSpeed ZeRO ({strategy}) steps inside "
            "its engine; use --on-nonfinite warn, or stop (with ZeRO it stops after the step), or --strategy "
            "ddp, fsdp or pp")


def norm_is_finite(norm: float | None) -> bool:
    """An unknown norm (None) is no evidence. DeepSpeed reports -1 for a norm that was inf or NaN."""
    return norm is None or (math.isfinite(norm) and norm >= 0)


def _gather_flags(finite: bool, group, world_size: int, async_op: bool):
    import torch
    import torch.distributed as dist

    mine = torch.tensor([1 if finite else 0], dtype=torch.uint8)
    if group is None:
        return None, [mine]
    out = [torch.zeros(1, dtype=torch.uint8) for _ in range(world_size)]
    return dist.all_gather(out, mine, group=group, async_op=async_op), out


def _bad_ranks(flags) -> list[int]:
    return [r for r, ok in enumerate(flags) if not int(ok)]


def gather_bad_ranks(loss_finite: bool, group, world_size: int) -> list[int]:
    """Collective over `group` (every rank calls it at the same point): the ranks whose own loss
    was not finite."""
    _, flags = _gather_flags(loss_finite, group, world_size, async_op=False)
    return _bad_ranks(flags)


@dataclass(frozen=True)
class NonFinite:
    """One step whose global gradient norm was not finite, and what was done about it."""

    step: int
    ranks: list[int]
    """Ranks whose own loss was not finite (in a pipeline: every stage of the replica)."""
    mode: str
    skipped: bool
    grad_norm: float | None

    @property
    def level(self) -> str:
        return "error" if self.mode in STOPPING else "warn"

    def _where(self) -> str:
        if not self.ranks:
            return "gradient norm not finite, loss finite on every rank"
        return f"loss not finite on rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"

    def text(self) -> str:
        if self.skipped:
            done = "step skipped" + ("; stopping" if self.mode in STOPPING else "")
        elif self.mode in STOPPING:
            done = "step left to DeepSpeed's engine (ringtop cannot skip it); stopping"
        else:
            done = "step applied"
        return f"step {self.step}: {self._where()}; {done} (--on-nonfinite {self.mode})"

    def stop_reason(self) -> str:
        return f"stopped: {self._where()} at step {self.step} (--on-nonfinite {self.mode})"

    def data(self) -> dict[str, Any]:
        # str: JSON has no NaN or inf, and None would read as "not known"
        return {"step": self.step, "ranks": self.ranks, "action": self.mode, "skipped": self.skipped,
                "grad_norm": None if self.grad_norm is None else str(self.grad_norm)}


class AsyncNaming:
    """`warn`'s naming, never waited for on the step path: each rank posts its flag when it
    publishes the step (in step order), and the result is taken once every rank has posted.
    Once the weights are NaN every later norm is too: only the first step of such a streak is
    named (every rank sees the same norms, so all post for the same steps)."""

    def __init__(self, world_size: int):
        import torch.distributed as dist

        self.world_size = world_size
        self.group = dist.new_group(backend="gloo") if world_size > 1 else None
        """Collective at construction: every rank builds one, at the same point."""
        self._posted: list[tuple[int, float | None, Any, Any]] = []
        """(step, grad_norm, the gather's work or None, its output flags), in step order."""
        self._norm_was_finite = True

    def observe(self, step: int, grad_norm: float | None, loss_finite: bool) -> None:
        """A published step: the first of a streak of steps whose norm is not finite is named."""
        finite = norm_is_finite(grad_norm)
        first_bad, self._norm_was_finite = self._norm_was_finite and not finite, finite
        if not first_bad:
            return
        work, flags = _gather_flags(loss_finite, self.group, self.world_size, async_op=True)
        self._posted.append((step, grad_norm, work, flags))

    def ready(self, wait: bool = False) -> list[NonFinite]:
        """The namings whose gathers are done, oldest first (`wait`: all of them)."""
        done = []
        while self._posted:
            step, grad_norm, work, flags = self._posted[0]
            if work is not None:
                if not wait and not work.is_completed():
                    break
                work.wait()  # done: returns at once, or raises the gather's error
            self._posted.pop(0)
            done.append(NonFinite(step, _bad_ranks(flags), "warn", False, grad_norm))
        return done
