"""A deterministic synthetic token stream, sharded by rank like a DistributedSampler.

Sample `i` of the global stream depends only on (seed, i). At step `s`, rank `r` of `N` with
per-rank batch `b` takes samples [s·N·b + r·b, s·N·b + (r+1)·b): N ranks with batch b see exactly
the batch one process with batch N·b sees, and the data position is just the step index.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

NOISE_FRACTION = 0.1


def synthetic_sample(index: int, seq_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """seq_len + 1 tokens: an arithmetic progression mod vocab with a per-sample stride, plus noise.

    Learnable (the stride can be read from the context) so the loss falls visibly.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    start = int(torch.randint(vocab_size, (1,), generator=g))
    stride = int(torch.randint(1, 17, (1,), generator=g))
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab_size
    noise = torch.rand(seq_len + 1, generator=g) < NOISE_FRACTION
    random_tokens = torch.randint(vocab_size, (seq_len + 1,), generator=g)
    return torch.where(noise, random_tokens, tokens)


def batch_from(first: int, batch_size: int, seq_len: int, vocab_size: int, seed: int):
    """(inputs, targets) of samples first .. first + batch_size - 1."""
    rows = torch.stack([synthetic_sample(first + i, seq_len, vocab_size, seed) for i in range(batch_size)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def global_batch(step: int, rank: int, world_size: int, batch_size: int, seq_len: int, vocab_size: int, seed: int):
    return batch_from((step * world_size + rank) * batch_size, batch_size, seq_len, vocab_size, seed)


def synthetic_batches(
    rank: int, world_size: int, batch_size: int, seq_len: int, vocab_size: int, seed: int, sample_offset: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches from sample `sample_offset` of the global stream on: a resumed run
    continues where the saved one stopped, whatever its world size and batch were."""
    k = 0
    while True:
        yield batch_from(sample_offset + (k * world_size + rank) * batch_size, batch_size, seq_len, vocab_size, seed)
        k += 1
