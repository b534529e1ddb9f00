"""An independent single-process reference: the whole global batch, plain AdamW, no ringtop code
beyond the model definition and the per-sample generator."""

from __future__ import annotations

import torch

from ringtop.agent.data import synthetic_sample
from ringtop.agent.model import MODEL_SIZES, build_tiny_gpt


def reference_run(steps: int, global_batch: int | list[int], seq_len: int, lr: float, seed: int = 0, size: str = "1m",
                  grad_clip: float = 0.0):
    """Losses per step and the final parameters of one process training on every sample.
    `global_batch` may be a list: the batch of each step (a run whose data-parallel width changed)."""
    torch.manual_seed(1234)
    model = build_tiny_gpt(size, seed)
    vocab = MODEL_SIZES[size].vocab_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = global_batch if isinstance(global_batch, list) else [global_batch] * steps
    losses, first = [], 0
    for step in range(steps):
        rows = torch.stack([synthetic_sample(first + i, seq_len, vocab, seed) for i in range(batches[step])])
        first += batches[step]
        optimizer.zero_grad()
        loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
