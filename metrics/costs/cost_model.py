"""The analytic cost of each parallel strategy: memory per rank, bytes on the wire, time, bubbles.

Torch-free (stdlib only): the UI imports this in a process without torch, and `ringtop plan` runs
on a laptop. Pure functions over small frozen dataclasses; units are in the names (`*_bytes`,
`*_s`, `*_gbps`), GB = 1e9 bytes (decimal, as the chapter's "7B x 2 bytes = 14 GB").

Conventions, each chosen because it reproduces the chapter (seed/distributed-training-basics.zh.txt)
and the ZeRO paper (arXiv 1910.02054) — the arithmetic is in the docstrings below:

- Memory (metrics/costs/memory_model.py, re-exported here; its `predicted_state` is the one prediction):
  params P x param_bytes, grads P x grad_bytes, optimizer P x optimizer_bytes_per_param;
  DDP replicates all three, ZeRO-1 divides the optimizer by N, ZeRO-2 grads and optimizer, ZeRO-3
  all three. FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, NO_SHARD = DDP.
- Bytes: "sent" is what one rank puts on the wire per step (ring algorithms); "payload" is the full
  logical tensor handed to the collective (nccl-tests' "size"), so sent = payload x busbw factor.
- Time: sent bytes / the link's per-direction bandwidth (half the bidirectional figure quoted).
- Overhead: comm_s / compute_s (communication added on top of an un-overlapped compute step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ringtop.metrics.costs.links import Link
from ringtop.metrics.costs.memory_model import (  # noqa: F401 - re-exported: the memory model lives in metrics
    DTYPE_BYTES,
    MemoryPerRank,
    ModelSpec,
    Sharding,
    _check_ranks,
    implementation_specs,
    memory_per_rank,
    predicted_state,
    shard_count,
    sharding_of,
)
from ringtop.metrics.strategy_names import DATA_PARALLEL_STRATEGIES, canonical_strategy
from ringtop.metrics.units import GB

# ---------------------------------------------------------------- inputs and outputs




@dataclass(frozen=True, slots=True)
class CollectiveBytes:
    """One kind of collective in one step.

    `payload_bytes`: the full logical tensors handed to it, summed over the step (nccl-tests'
    "size": the all-reduced buffer, the reduce-scatter input, the all-gather output) — what a
    tracer counting input buffers sees. `sent_bytes`: what each rank transmits for them.
    """

    kind: str
    payload_bytes: int
    sent_bytes: int


@dataclass(frozen=True, slots=True)
class CommPerStep:
    """Bytes each rank sends per optimizer step, broken down by collective kind."""

    collectives: tuple[CollectiveBytes, ...] = ()

    @property
    def sent_bytes(self) -> int:
        return sum(c.sent_bytes for c in self.collectives)

    @property
    def payload_bytes(self) -> int:
        return sum(c.payload_bytes for c in self.collectives)

    def by_kind(self) -> dict[str, CollectiveBytes]:
        """Per kind, entries of the same kind summed (e.g. ZeRO-3's two all-gathers become one)."""
        out: dict[str, CollectiveBytes] = {}
        for c in self.collectives:
            prev = out.get(c.kind)
            out[c.kind] = c if prev is None else CollectiveBytes(
                c.kind, prev.payload_bytes + c.payload_bytes, prev.sent_bytes + c.sent_bytes)
        return out


@dataclass(frozen=True, slots=True)
class StrategyCost:
    """Memory and traffic of one strategy for one model on `ranks` ranks."""

    strategy: str
    ranks: int
    memory: MemoryPerRank
    comm: CommPerStep
    pp_stages: int = 1


@dataclass(frozen=True, slots=True)
class FitResult:
    """Whether a strategy's state plus an allowance for activations/other fits a device."""

    strategy: str
    need_bytes: int
    capacity_bytes: int
    fits: bool
    cost: StrategyCost = field(repr=False)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.need_bytes


# ---------------------------------------------------------------- strategies




def ring_all_reduce_sent_bytes(payload_bytes: int, ranks: int) -> int:
    """Ring all-reduce: reduce-scatter then all-gather, each sending (N-1)/N of the buffer: 2(N-1)/N x P."""
    return round(2 * (ranks - 1) * payload_bytes / ranks)


def ring_reduce_scatter_sent_bytes(payload_bytes: int, ranks: int, *, gloo_as_all_reduce: bool = False) -> int:
    """(N-1)/N of the full input. On gloo, reduce_scatter_tensor runs as an all-reduce of the
    full input (cpu-distributed-facts.md), so its wire bytes are twice a true reduce-scatter's."""
    if gloo_as_all_reduce:
        return ring_all_reduce_sent_bytes(payload_bytes, ranks)
    return round((ranks - 1) * payload_bytes / ranks)


def ring_all_gather_sent_bytes(payload_bytes: int, ranks: int) -> int:
    """(N-1)/N of the gathered output: each rank forwards the N-1 shards it does not own."""
    return round((ranks - 1) * payload_bytes / ranks)


def comm_per_step(strategy: str, ranks: int, model: ModelSpec, *, pp_stages: int = 1,
                  gloo_reduce_scatter_as_all_reduce: bool = False,
                  activation_bytes_per_micro_batch: int = 0, micro_batches: int = 1) -> CommPerStep:
    """Bytes each rank sends per optimizer step (one forward and backward, no gradient accumulation).

    With G = P x grad_bytes and W = P x param_bytes, N data-parallel ranks:
      DDP, FSDP NO_SHARD   all_reduce G                      -> 2(N-1)/N G
      ZeRO-1, ZeRO-2       reduce_scatter G + all_gather W   -> (N-1)/N (G + W) = DDP's when G = W
      FSDP SHARD_GRAD_OP   all_gather W once (forward) + reduce_scatter G: the same volume
      ZeRO-3, FULL_SHARD   all_gather W in forward and again in backward + reduce_scatter G
                           -> 3(N-1)/N W = 1.5x DDP (the chapter: "约 1.5 倍" of Stage 2)
      pp                   all_reduce of its stage's G/S over the N/S replicas, plus point-to-point
                           activations when `activation_bytes_per_micro_batch` is given (kind "send").
    """
    s = canonical_strategy(strategy)
    if s == "tp":
        raise ValueError("tp sends activations, not gradients: its bytes come from the model's shape "
                         "(mesh_cost.tp_comm_per_step)")
    stages = pp_stages if s == "pp" else 1
    dp = _check_ranks(ranks, stages)
    params = shard_count(model.params, stages)
    grads_payload = params * model.grad_bytes
    params_payload = params * model.param_bytes

    def reduce_scatter() -> CollectiveBytes:
        return CollectiveBytes("reduce_scatter", grads_payload, ring_reduce_scatter_sent_bytes(
            grads_payload, dp, gloo_as_all_reduce=gloo_reduce_scatter_as_all_reduce))

    def all_gather(times: int) -> CollectiveBytes:
        return CollectiveBytes("all_gather", times * params_payload,
                               times * ring_all_gather_sent_bytes(params_payload, dp))

    if s in ("ddp", "fsdp-no-shard"):
        out: tuple[CollectiveBytes, ...] = (
            CollectiveBytes("all_reduce", grads_payload, ring_all_reduce_sent_bytes(grads_payload, dp)),)
    elif s in ("zero1", "zero2", "fsdp-grad-op"):
        out = (reduce_scatter(), all_gather(1))
    elif s in ("zero3", "fsdp-full"):
        out = (all_gather(2), reduce_scatter())
    else:  # pp: no data-parallel group (and no all-reduce) when every rank is its own stage
        out = ()
        if dp > 1:
            out = (CollectiveBytes("all_reduce", grads_payload, ring_all_reduce_sent_bytes(grads_payload, dp)),)
        if activation_bytes_per_micro_batch:
            p2p = pipeline_p2p_sent_bytes(activation_bytes_per_micro_batch, micro_batches)
            out += (CollectiveBytes("send", p2p, p2p),)
    return CommPerStep(out)


def strategy_cost(strategy: str, ranks: int, model: ModelSpec, *, pp_stages: int = 1,
                  gloo_reduce_scatter_as_all_reduce: bool = False) -> StrategyCost:
    """Memory per rank and traffic per step of one strategy."""
    s = canonical_strategy(strategy)
    stages = pp_stages if s == "pp" else 1
    return StrategyCost(
        strategy=s, ranks=ranks, pp_stages=stages,
        memory=memory_per_rank(s, ranks, model, pp_stages=stages),
        comm=comm_per_step(s, ranks, model, pp_stages=stages,
                           gloo_reduce_scatter_as_all_reduce=gloo_reduce_scatter_as_all_reduce),
    )


# ---------------------------------------------------------------- time on a link


def comm_time_s(sent_bytes: int | float, link: Link | float) -> float:
    """Seconds to send `sent_bytes` from one rank: bytes / per-direction bandwidth (bandwidth-bound,
    no latency, no overlap). `link` is a Link or a number of GB/s per direction.

    The chapter's example: 7e9 bf16 gradients = 14 GB, ring all-reduce over 8 GPUs sends
    2 x 7/8 x 14 = 24.5 GB per rank (and receives as much at the same time).
      NVLink 4.0, 900 GB/s bidirectional = 450 per direction: 24.5 / 450 = 0.0544 s  ("~0.05 s")
      PCIe Gen4, 64 GB/s bidirectional  =  32 per direction: 24.5 / 32  = 0.766 s   ("~0.8 s")
    Dividing by the bidirectional figure instead gives 0.027 s and 0.38 s, which the chapter does
    not say; equivalently, its numbers are (sent + received) / bidirectional bandwidth.
    """
    gbps = link.per_direction_gbps if isinstance(link, Link) else float(link)
    if gbps <= 0:
        raise ValueError(f"bandwidth must be > 0 GB/s, got {gbps}")
    return float(sent_bytes) / (gbps * GB)


def comm_overhead(comm_s: float, compute_s: float) -> float:
    """Communication as a fraction of the compute step: comm_s / compute_s (the chapter's measure).

    Chapter, 2 s compute step: 0.0544 / 2 = 2.7 % over NVLink (it writes 2.5 % = 0.05 / 2, from the
    rounded time) and 0.766 / 2 = 38 % over PCIe Gen4 ("30%+"). comm / (compute + comm) would give
    2.65 % and 27.7 %, contradicting "30%+", so the chapter's formula is comm / compute.
    """
    if compute_s <= 0:
        raise ValueError(f"compute step must be > 0 s, got {compute_s}")
    return comm_s / compute_s


def comm_share_of_step(comm_s: float, compute_s: float) -> float:
    """Communication as a share of the whole step when nothing overlaps: comm / (compute + comm)."""
    total = comm_s + compute_s
    if total <= 0:
        raise ValueError("step time must be > 0")
    return comm_s / total


# ---------------------------------------------------------------- pipeline


def _check_pipeline(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages and micro-batches must be >= 1, got {stages} and {micro_batches}")


def gpipe_bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe step: (S-1)/(S+M-1). S=4: M=1 -> 3/4 = 75 %, M=8 -> 3/11 = 27 %, M=32 -> 3/35 = 9 %."""
    _check_pipeline(stages, micro_batches)
    return (stages - 1) / (stages + micro_batches - 1)


def one_f_one_b_bubble_fraction(stages: int, micro_batches: int) -> float:
    """1F1B reorders work but idles as long as GPipe: (S-1)/(S+M-1); it saves activation memory instead."""
    _check_pipeline(stages, micro_batches)
    return (stages - 1) / (stages + micro_batches - 1)


def peak_in_flight_micro_batches(schedule: str, stages: int, micro_batches: int, stage: int = 0) -> int:
    """Micro-batches whose activations a stage holds at once: GPipe all M; 1F1B at most S - stage."""
    _check_pipeline(stages, micro_batches)
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in [0, {stages}), got {stage}")
    key = schedule.strip().lower()
    if key == "gpipe":
        return micro_batches
    if key in ("1f1b", "one_f_one_b"):
        return min(stages - stage, micro_batches)
    raise ValueError(f"unknown pipeline schedule {schedule!r}: use gpipe or 1f1b")


def pipeline_p2p_sent_bytes(activation_bytes_per_micro_batch: int, micro_batches: int) -> int:
    """A middle stage sends each micro-batch's activations forward and their gradients back: 2 x M x A."""
    if activation_bytes_per_micro_batch < 0 or micro_batches < 1:
        raise ValueError("activation bytes must be >= 0 and micro-batches >= 1")
    return 2 * micro_batches * activation_bytes_per_micro_batch


# ---------------------------------------------------------------- activations

ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN = 34
"""Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198), section 4.1, eq. 1 without tensor or sequence parallelism: one layer keeps
s·b·h·(34 + 5·a·s/h) bytes of 16-bit activations for its backward (the 5·a·s/h: the attention
scores, softmax output and its dropout mask, a·s² per sequence)."""


RECOMPUTE_FLOPS_FACTOR = 4 / 3
"""Full activation checkpointing runs each layer's forward again in backward: forward is a third
of a step's 6N FLOPs per token (2N of 6N), so the step does 8N: 4/3 of it."""


def activation_bytes_per_micro_batch(layers: int, hidden: int, heads: int, seq_len: int, micro_batch_size: int,
                                     vocab: int, activation_bytes: int = 2, *, flash_attention: bool = True,
                                     checkpointing: bool = False) -> int:
    """Activations one micro-batch keeps from forward to backward: the layers by Korthikanti's
    count (scaled from 2-byte to `activation_bytes`; with a fused, flash-style attention kernel the
    a·s² score terms are not kept), plus the output logits and their softmax in fp32 for the loss
    (2 x 4 x s·b·V), which at a 32k-50k vocabulary rival a layer.

    With full `checkpointing` (Korthikanti section 5) a layer keeps only its input, s·b·h values,
    and one layer's full set is live while it is recomputed in backward."""
    if min(layers, hidden, heads, seq_len, micro_batch_size, vocab, activation_bytes) < 1:
        raise ValueError("layers, hidden, heads, sequence length, micro-batch size, vocab and bytes must be >= 1")
    sbh = seq_len * micro_batch_size * hidden
    per_layer = sbh * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN
    if not flash_attention:
        per_layer += 5 * heads * seq_len * seq_len * micro_batch_size
    per_layer = per_layer * activation_bytes // 2
    logits = 2 * 4 * seq_len * micro_batch_size * vocab
    if checkpointing:
        return layers * sbh * activation_bytes + per_layer + logits
    return layers * per_layer + logits


# ---------------------------------------------------------------- what fits


def fits(memory: MemoryPerRank, capacity_bytes: int | float, other_bytes: int | float = 0) -> bool:
    """State plus the allowance for activations/buffers/CUDA context fits in `capacity_bytes`."""
    return memory.total_bytes + other_bytes <= capacity_bytes


def which_fit(model: ModelSpec, ranks: int, capacity_bytes: int | float, other_bytes: int | float = 0, *,
              strategies: tuple[str, ...] | None = None, pp_stages: int = 1,
              gloo_reduce_scatter_as_all_reduce: bool = False) -> list[FitResult]:
    """For each strategy (default: all but `pp` unless `pp_stages` > 1), whether it fits a device.

    The chapter's 7.6e9-param bf16 model on 8 x 80 GB: DDP (91.2 GB) does not fit; ZeRO-1 (38.0)
    and beyond do.
    """
    if strategies is None:
        strategies = DATA_PARALLEL_STRATEGIES + (("pp",) if pp_stages > 1 else ())
    out = []
    for name in strategies:
        cost = strategy_cost(name, ranks, model, pp_stages=pp_stages,
                             gloo_reduce_scatter_as_all_reduce=gloo_reduce_scatter_as_all_reduce)
        need = cost.memory.total_bytes + math.ceil(other_bytes)
        out.append(FitResult(cost.strategy, need, math.floor(capacity_bytes), need <= capacity_bytes, cost))
    return out


def implementation_cost(strategy: str, ranks: int, param_count: int, dtype: str = "fp32", *,
                        gloo: bool = False, param_tensors: int = 0) -> StrategyCost:
    """What ringtop's own implementation of `strategy` holds per rank between steps
    (metrics.memory_model.predicted_state) and sends per step: the one answer to "what would
    strategy X hold here" that the agent's prediction, the switch picker, the Memory tab's fit
    table and `ringtop plan` all give."""
    _, wire = implementation_specs(strategy, param_count, dtype)
    s = canonical_strategy(strategy)
    memory = predicted_state(s, ranks, param_count, dtype, param_tensors).memory
    return StrategyCost(strategy=s, ranks=ranks, pp_stages=1, memory=memory,
                        comm=comm_per_step(s, ranks, wire, gloo_reduce_scatter_as_all_reduce=gloo))
