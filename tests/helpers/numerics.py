"""How a run is compared with the single-process reference, portably (any x86-64 or ARM CPU, any
SIMD width, any thread count), and assertions that say where the largest difference is.

What differs between a distributed run and the reference is only the order of fp32 sums: a rank
sums half the batch, the all-reduce adds the halves, another CPU or thread count blocks a matmul
differently. Each such sum is off by a few units of fp32's epsilon (1.19e-7) relative to the
magnitude of its terms. What that does to each compared quantity:

- **Parameters.** AdamW moves a coordinate by lr * m/(sqrt(v)+eps), and m/sqrt(v) depends only on
  the *relative* error of the gradient. Where a coordinate's gradient is well determined (most of
  them) that error is far below 1e-3, so the update differs by less than 1e-3 * lr a step; where
  the gradient is nearly zero beside the terms it sums (cancellation), rounding can flip its sign
  and the coordinate may drift by up to ~lr a step (|m/sqrt(v)| <~ 1), and Adam gives no tighter
  bound for it. Hence two checks per tensor: its RMS difference <= steps * lr * 1e-3 (`param_atol`:
  the well-determined bulk dominates a mean of squares), and every element <= steps * lr
  (`param_max_atol`). A genuine mistake moves the bulk by ~lr a step or more (a skipped update, a
  wrong shard), far over the first. A parameter with no true gradient at all (its gradient is all
  rounding noise) would break the first, which is why the built-in model has none: see
  `agent/models/model.py` on the qkv bias.
- **Losses.** One fp32 mean over the tokens of a step (a few hundred here; pairwise sums lose
  about log2(n) * eps relative), evaluated at parameters already within `param_atol`:
  `LOSS_RTOL` = 1e-5, about 80 eps, 10-40x what was measured.
- **Gradient norms.** A sum of squares of the same gradients, well conditioned (all terms
  positive): `GRAD_NORM_RTOL` = 1e-4. Adam is blind to a gradient's scale, so only this check
  catches a gradient scaled by a constant (1.001 is caught, `test_equivalence_checks_bite.py`).

Never widen a tolerance to make a test pass on a new machine: find the quantity whose error is not
bounded like this (a parameter with no true gradient, a reduction in another precision) instead.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

EPS32 = torch.finfo(torch.float32).eps
UPDATE_RTOL = 1e-3
LOSS_RTOL = 1e-5
GRAD_NORM_RTOL = 1e-4


def _report(what: str, worst: float, tolerance: float) -> None:
    """With RINGTOP_NUMERICS_LOG=FILE, each comparison appends its margin there (for the notes)."""
    path = os.environ.get("RINGTOP_NUMERICS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "?"), "what": what,
                                "worst": worst, "tolerance": tolerance}) + "\n")


def param_atol(steps: int, lr: float) -> float:
    """How far a tensor trained `steps` AdamW steps may drift from the reference (RMS) on rounding."""
    return steps * lr * UPDATE_RTOL


def param_max_atol(steps: int, lr: float) -> float:
    """How far one element may drift: ~lr a step where rounding decides its update's sign."""
    return steps * lr


def assert_state_close(actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], *,
                       steps: int, lr: float, allow_missing: frozenset[str] = frozenset()) -> None:
    """Every expected tensor within `param_atol` (RMS) and `param_max_atol` (each element) of the
    reference; a failure names the tensor, the largest difference, its index, both values and the
    tolerance."""
    missing = set(expected) - set(actual) - allow_missing
    assert not missing, f"tensors missing from the run's state: {sorted(missing)}"
    rms_atol, max_atol = param_atol(steps, lr), param_max_atol(steps, lr)
    worst_rms: tuple[float, str] = (0.0, "")
    worst_max: tuple[float, str, tuple, float, float] = (0.0, "", (), 0.0, 0.0)
    for name, want in expected.items():
        if name not in actual:
            continue
        got = actual[name].detach().to("cpu", torch.float64)
        want = want.detach().to("cpu", torch.float64)
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, reference {tuple(want.shape)}"
        if got.numel() == 0:
            continue
        assert torch.isfinite(got).all(), f"{name} holds non-finite values"
        diff = (got - want).abs()
        rms = float(diff.pow(2).mean().sqrt())
        flat = int(diff.argmax())
        largest = float(diff.reshape(-1)[flat])
        if rms > worst_rms[0]:
            worst_rms = (rms, name)
        if largest > worst_max[0]:
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
            worst_max = (largest, name, index, float(got.reshape(-1)[flat]), float(want.reshape(-1)[flat]))
    largest, name, index, got_value, want_value = worst_max
    where = (f"largest element difference {largest:.3g} at {name}{list(index)} (run {got_value:.9g}, reference "
             f"{want_value:.9g}); largest RMS difference {worst_rms[0]:.3g} in {worst_rms[1]}")
    _report("parameters (RMS)", worst_rms[0], rms_atol)
    _report("parameters (element)", largest, max_atol)
    assert worst_rms[0] <= rms_atol, (f"{where}; RMS tolerance {rms_atol:.3g} = {steps} steps x lr {lr:g} x "
                                      f"{UPDATE_RTOL:g}")
    assert largest <= max_atol, f"{where}; element tolerance {max_atol:.3g} = {steps} steps x lr {lr:g}"


def assert_series_close(actual: Sequence[float | None], expected: Sequence[float], *, rtol: float, what: str,
                        first_step: int = 1) -> None:
    """Per-step values (losses, gradient norms) within `rtol`; the message names the worst step."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} steps, reference {len(expected)}"
    worst: tuple[float, int] | None = None
    for i, (got, want) in enumerate(zip(actual, expected)):
        if got is None or not math.isfinite(got):
            raise AssertionError(f"{what} at step {first_step + i} is {got} (reference {want:.9g})")
        rel = abs(got - want) / max(abs(want), 1e-30)
        if worst is None or rel > worst[0]:
            worst = (rel, i)
    if worst is None:
        return
    rel, i = worst
    _report(what, rel, rtol)
    assert rel <= rtol, (f"{what}: largest relative difference {rel:.3g} at step {first_step + i} "
                         f"(run {actual[i]:.9g}, reference {expected[i]:.9g}); tolerance {rtol:g}")


def mean_losses(run) -> list[float]:
    """A 2-rank data-parallel run's global-batch loss: the mean of the ranks' (equal shards)."""
    return [(a.loss + b.loss) / 2 for a, b in zip(run.steps(0), run.steps(1))]


def assert_trains_like_the_reference(run, reference, steps: int, lr: float, first_step: int = 1) -> None:
    """Losses and gradient norms of a finished 2-rank data-parallel run (steps `first_step`..`steps`)
    and the parameters of its full checkpoint at `steps`, against the single-process reference."""
    from ringtop.agent.checkpoints.format import load_full_files

    first = first_step - 1
    assert_series_close(mean_losses(run), reference.losses[first:steps], rtol=LOSS_RTOL, what="loss",
                        first_step=first_step)
    for rank in (0, 1):
        assert_series_close([s.grad_norm for s in run.steps(rank)], reference.grad_norms[first:steps],
                            rtol=GRAD_NORM_RTOL, what=f"rank {rank}'s gradient norm", first_step=first_step)
    model_state, _, payload = load_full_files(run.checkpoint_dir / f"step-{steps:08d}-full")
    assert payload["step"] == steps
    assert_state_close(model_state, reference.state, steps=steps, lr=lr)


def state_max_diff(a: Any, b: Any) -> float:
    """Largest absolute difference between two nested states of the same structure; inf when the
    structures or shapes differ."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return float("inf")
        return max((state_max_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return float("inf")
        return max((state_max_diff(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape:
            return float("inf")
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    return 0.0 if a == b else float("inf")


def cloned_state(state: Any) -> Any:
    """A deep copy of a nested state's tensors (a full state may alias live ones)."""
    if isinstance(state, dict):
        return {k: cloned_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(cloned_state(v) for v in state)
    return state.clone() if isinstance(state, torch.Tensor) else state


def assert_2d_trains_like_the_reference(run, reference, tp_groups=((0, 1), (2, 3))) -> dict:
    """A dp x tp run (2D): each tp group computes one loss from one batch, to the bit; the mean over
    the groups' losses and every rank's gradient norm follow the single-process reference with
    the global batch. Returns each rank's steps."""
    steps = {rank: run.steps(rank) for group in tp_groups for rank in group}
    for first, *others in tp_groups:
        for other in others:
            assert [s.loss for s in steps[first]] == [s.loss for s in steps[other]]
    heads = [steps[group[0]] for group in tp_groups]
    assert_series_close([sum(s.loss for s in at) / len(at) for at in zip(*heads)], reference.losses,
                        rtol=LOSS_RTOL, what="loss")
    for rank, own in steps.items():
        assert_series_close([s.grad_norm for s in own], reference.grad_norms, rtol=GRAD_NORM_RTOL,
                            what=f"rank {rank}'s gradient norm")
    return steps


def assert_moves_what_it_predicts(run, expected: dict[str, tuple[int, int]], ranks: Sequence[int]) -> None:
    """Every step of each rank called each collective kind as `expected` says ({kind: (calls,
    bytes)}), and its Hello predicted exactly those bytes."""
    from ringtop.protocol import Hello

    for rank in ranks:
        predicted = next(m for m in run.messages(rank) if isinstance(m, Hello)).prediction
        assert predicted.comm_payload_bytes == {kind: nbytes for kind, (_, nbytes) in expected.items()}
        for step in run.steps(rank):
            assert {c.kind: (c.count, c.bytes) for c in step.comm} == expected, step.comm
            assert bytes_by_kind(step.comm) == predicted.comm_payload_bytes


def bytes_by_kind(comm) -> dict[str, int]:
    """A step's collective bytes per kind, summed over its mesh dimensions (CommStat.group)."""
    out: dict[str, int] = {}
    for c in comm:
        out[c.kind] = out.get(c.kind, 0) + c.bytes
    return out
