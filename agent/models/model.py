"""The built-in decoder-only transformer, defined in code so nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int
    max_seq_len: int = 1024


MODEL_SIZES: dict[str, GPTConfig] = {
    "1m": GPTConfig(n_layer=4, n_head=4, d_model=128, vocab_size=1024),
    "10m": GPTConfig(n_layer=6, n_head=5, d_model=320, vocab_size=8192),
    "25m": GPTConfig(n_layer=8, n_head=7, d_model=448, vocab_size=16384),
    "125m": GPTConfig(n_layer=12, n_head=12, d_model=768, vocab_size=50257),
}


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        """Heads this module computes: all of them, or a tensor-parallel rank's share."""
        self.head_dim = cfg.d_model // cfg.n_head
        self.qkv_by_head = False
        """The fused qkv's output rows are grouped by head (each head's q, k, v together) rather
        than q|k|v: so that a split by rows hands a tensor-parallel rank whole heads."""
        self.ln1 = nn.LayerNorm(cfg.d_model)
        # No bias on q, k, v (as in LLaMA): the key third of one would have no true gradient (a
        # vector added to every key shifts a softmax row by a constant, which softmax ignores), so
        # Adam would move it by ~lr a step on rounding noise alone, differently on every CPU.
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc_out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = self.n_head * self.head_dim
        qkv = self.qkv(self.ln1(x))
        b, t, _ = qkv.shape  # sequence parallelism: x holds a slice of the sequence, qkv all of it
        if self.qkv_by_head:
            q, k, v = qkv.view(b, t, self.n_head, 3, self.head_dim).unbind(3)
        else:
            q, k, v = (z.view(b, t, self.n_head, self.head_dim) for z in qkv.split(width, dim=2))
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, width))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """Pre-LN GPT with tied embeddings; forward(inputs, targets) returns the mean token loss.

    Layers sit in `blocks` so later strategies can wrap or split them one by one.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = inputs.shape[1]
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds the model's maximum {self.cfg.max_seq_len}")
        pos = torch.arange(t, device=inputs.device)
        x = self.tok_emb(inputs) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def build_tiny_gpt(size: str, seed: int) -> TinyGPT:
    """Same seed, same weights, on every rank and in every reference run."""
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose from {', '.join(MODEL_SIZES)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(MODEL_SIZES[size])


def count_params(model: nn.Module) -> int:
    """Unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
