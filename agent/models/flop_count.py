"""FLOPs per training token of the model being trained, found once at start, never on the step path.

The built-in model by the formula (ringtop.metrics.costs.flops); any other module by counting one forward
and backward with `torch.utils.flop_counter.FlopCounterMode` on a copy of it on the meta device:
shapes only, no memory for weights, no compute, no collective (the copy is taken before a strategy
wraps the model, so none of its hooks run).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ringtop.agent.models.factories import batch_to, batch_tokens, call_model
from ringtop.agent.models.model import TinyGPT, count_params
from ringtop.metrics.costs.flops import transformer_flops_per_token

META = torch.device("meta")


@dataclass(frozen=True)
class FlopsPerToken:
    flops: float
    """0.0: not known (the count failed); the Steps then carry no TFLOP/s."""
    source: str
    """How it was found (`formula 6N+12LHS`, `counted`), or why it was not."""


def tiny_gpt_flops_per_token(model: TinyGPT, seq_len: int) -> FlopsPerToken:
    """6 × N + 12 × L × H × S with N every parameter but the position table (the token table is
    also the output head: its matmul runs every token)."""
    cfg = model.cfg
    non_embedding = count_params(model) - model.pos_emb.weight.numel()
    flops = transformer_flops_per_token(non_embedding, cfg.n_layer, cfg.d_model, seq_len)
    return FlopsPerToken(flops, "formula 6N+12LHS")


def meta_copy(model: nn.Module) -> nn.Module:
    """The module's structure with every parameter and buffer on the meta device (tied weights
    stay tied); the weights themselves are not copied."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device=META), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device=META)
    return copy.deepcopy(model, memo)


def counted_flops_per_token(meta_model: nn.Module, batch: Any) -> FlopsPerToken:
    """One forward and backward of `batch` through a meta copy, counted; FLOPs over the batch's tokens."""
    tokens = batch_tokens(batch)
    if tokens <= 0:
        return FlopsPerToken(0.0, "not counted: the batch has no tensor to count tokens in")
    try:
        with FlopCounterMode(display=False) as counter:
            call_model(meta_model, batch_to(batch, META)).backward()
    except Exception as exc:  # an op without a meta kernel, data-dependent control flow
        return FlopsPerToken(0.0, f"not counted: {type(exc).__name__}: {exc}"[:200])
    total = counter.get_total_flops()
    if total <= 0:
        return FlopsPerToken(0.0, "not counted: the flop counter saw no matmul")
    return FlopsPerToken(total / tokens, "counted")
