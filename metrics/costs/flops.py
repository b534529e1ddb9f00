"""Model FLOPs per token, achieved TFLOP/s and MFU: each figure defined once, for the agent, the UI,
the log readers and the Prometheus exporter.

A decoder transformer's training step (forward + backward) costs, per token,

    flops_per_token = 6 × N + 12 × L × H × S

(PaLM, Chowdhery et al. 2022, appendix B "Compute usage and model FLOPs utilization"; torchtitan's
`get_num_flop_per_token`, torchtitan/models/utils.py: `6 * (nparams - nparams_embedding) + 12 * l * h * q * t`):

- N: the parameters that multiply activations: every parameter but the embedding look-up tables.
  A look-up costs no multiply; an output head tied to the token embedding does, so with tied
  embeddings the shared table counts once, as the head. 2 FLOPs per parameter per token forward
  (a multiply and an add), 4 backward (the activations' and the weights' gradients).
- 12 × L × H × S: attention's own matmuls, Q·Kᵀ and scores·V, 2 × 2 × S × H per token and layer
  forward, twice that backward; L layers, H the hidden size (heads × head dim), S the sequence
  length. Counted over the full S × S scores, causal mask or not, as PaLM and torch's flop counter
  count them.

MFU is achieved model FLOP/s over the accelerator's dense peak (metrics.peaks): recomputation
(activation checkpointing) is work the model did not need, so it is left out, as PaLM does.

Stdlib only, like the rest of `ringtop.metrics`.
"""

from __future__ import annotations

import math

FLOPS_PER_TFLOP = 1e12


def transformer_flops_per_token(non_embedding_params: int, layers: int, hidden: int, seq_len: int) -> float:
    """6 × N + 12 × L × H × S: one training token's forward and backward FLOPs (see the module)."""
    if min(non_embedding_params, layers, hidden, seq_len) < 0:
        raise ValueError("parameter count, layers, hidden size and sequence length must be >= 0")
    return 6.0 * non_embedding_params + 12.0 * layers * hidden * seq_len


def achieved_tflops(flops_per_token: float, tokens: int, step_ms: float) -> float:
    """TFLOP/s of one step: its tokens' FLOPs over its wall time; 0.0 when either is not known."""
    if flops_per_token <= 0 or tokens <= 0 or not step_ms > 0 or not math.isfinite(step_ms):
        return 0.0
    return flops_per_token * tokens / (step_ms / 1e3) / FLOPS_PER_TFLOP


def step_tflops(flops_per_token: float, tokens: int, step_flops: float, step_ms: float) -> float:
    """TFLOP/s of one step from what is known of its work: the FLOPs given for the step itself, else
    FLOPs per token × its tokens; 0.0 (not known) with neither. Never a guess from shapes."""
    if step_flops > 0 and step_ms > 0 and math.isfinite(step_ms) and math.isfinite(step_flops):
        return step_flops / (step_ms / 1e3) / FLOPS_PER_TFLOP
    return achieved_tflops(flops_per_token, tokens, step_ms)


def missing_reason(flops_per_token: float, flops_source: str) -> str:
    """Why a run shows no TFLOP/s, in a few words for the screen: FLOPs per token known but no
    tokens (an own loop that gave none), none given, or a count that failed."""
    if flops_per_token > 0:
        return "give tokens per step"
    if flops_source.startswith(NOT_GIVEN):
        return "give tokens and FLOPs per token, or FLOPs per step"
    return "FLOPs not counted"


NOT_GIVEN = "not given"
"""How a FLOPs source that the user did not give begins (an own loop's: ringtop does not guess)."""


def mfu(tflops: float, peak_tflops: float) -> float | None:
    """Model FLOPs utilisation as a ratio (0.42 = 42 %); None when the peak is not known: an
    unknown accelerator has no MFU, never one against a guessed peak."""
    if not peak_tflops > 0 or not math.isfinite(peak_tflops) or not math.isfinite(tflops):
        return None
    return max(0.0, tflops) / peak_tflops


def within(estimate: float, reference: float, tolerance: float = 0.10) -> bool:
    """Whether an estimate is within `tolerance` (a share) of a reference count."""
    return reference > 0 and abs(estimate - reference) <= tolerance * reference
