"""An independent single-process reference: the whole global batch, plain AdamW, no ringtop code
beyond the model definition and the per-sample generator. Configured like the ranks (one intra-op
thread, as `conftest.agent_env` sets OMP_NUM_THREADS=1), whatever thread count pytest runs with."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ringtop.agent.models.data import synthetic_sample
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt


class Reference(NamedTuple):
    losses: list[float]
    """Per step, the mean token loss over the global batch."""
    state: dict[str, torch.Tensor]
    """The final parameters."""
    grad_norms: list[float]
    """Per step, the global gradient norm before clipping (the tied weight once)."""


def reference_run(steps: int, global_batch: int | list[int], seq_len: int, lr: float, seed: int = 0, size: str = "1m",
                  grad_clip: float = 0.0, threads: int = 1, model: str | None = None) -> Reference:
    """One process training on every sample. `global_batch` may be a list: the batch of each step
    (a run whose data-parallel width changed). `model`: an hf architecture (`hf:llama-tiny`)
    instead of the built-in model of `size`."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(steps, global_batch, seq_len, lr, seed, size, grad_clip, model)
    finally:
        torch.set_num_threads(before)


def _train(steps, global_batch, seq_len, lr, seed, size, grad_clip, hf_spec=None) -> Reference:
    torch.manual_seed(1234)
    if hf_spec is None:
        model = build_tiny_gpt(size, seed)
        vocab = MODEL_SIZES[size].vocab_size
    else:
        from ringtop.agent.models.hf_models import build_hf_model

        model = build_hf_model(hf_spec, seed)
        vocab = model.spec.dims.vocab
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = global_batch if isinstance(global_batch, list) else [global_batch] * steps
    losses, norms, first = [], [], 0
    for step in range(steps):
        rows = torch.stack([synthetic_sample(first + i, seq_len, vocab, seed) for i in range(batches[step])])
        first += batches[step]
        optimizer.zero_grad()
        loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        # In float64: one fp32 sum of a million squares is off by ~3e-5 (the strategies' per-tensor
        # norms are not); parameters() yields a tied weight once.
        norms.append(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None) ** 0.5)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return Reference(losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, norms)
