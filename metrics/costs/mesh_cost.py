"""The analytic cost of tensor, pipeline and data parallelism on one mesh (TP x PP x DP): memory per
rank, bytes per step in each dimension's groups, the bubble, time on each dimension's link.

Torch-free, like cost_model.py (whose conventions it keeps: GB = 1e9, "payload" is the logical
tensor handed to a collective, "sent" what one rank puts on the wire, time = sent / per-direction
bandwidth). The layout is Megatron's (arXiv 1909.08053), as the chapter describes it (its 64-GPU
example: 8 TP x 2 PP x 4 DP):

- TP splits each layer's matrices N ways (Colwise for qkv and MLP up, Rowwise for attention out and
  MLP down), so every layer all-reduces its activations [micro-batch, seq, hidden] twice in forward
  (after attention and after the MLP) and twice in backward (their input gradients): 4 per layer
  per micro-batch, each a ring moving 2(N-1)/N of it. Measured on gloo with PyTorch's DTensor
  (shared/notes/tensor-parallel-facts.md): a 2-layer model, batch 4, seq 32, d 64, fp32 has 8
  all-reduces and 262,144 payload bytes per rank per step — 8 x 4 x 32 x 64 x 4.
- PP puts layers / PP consecutive layers on each stage; a stage sends each micro-batch's
  activations forward and their gradients back: 2 x M x [micro-batch, seq, hidden] (each TP rank
  sends its full copy, as torch.distributed.pipelining does; Megatron's scatter-gather sends 1/TP).
- DP runs a data-parallel strategy (cost_model: ddp, zero1-3, fsdp) over the DP ranks holding the
  same shard, on that shard's parameters: P / (TP x PP) of them.

Parameters are taken as split evenly by TP and PP (embeddings too: vocab-parallel, as Megatron
does; the replicated LayerNorms are a rounding error of P). Activation memory is not modelled here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtop.metrics.costs.cost_model import (
    CollectiveBytes,
    CommPerStep,
    MemoryPerRank,
    ModelSpec,
    comm_per_step,
    comm_time_s,
    gpipe_bubble_fraction,
    memory_per_rank,
    pipeline_p2p_sent_bytes,
    ring_all_gather_sent_bytes,
    ring_all_reduce_sent_bytes,
    ring_reduce_scatter_sent_bytes,
    shard_count,
)
from ringtop.metrics.costs.links import Link
from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.metrics.strategy_names import canonical_strategy

TP_ALL_REDUCES_PER_LAYER = 4
"""Per micro-batch: 2 in forward (attention out, MLP down), 2 in backward (qkv, MLP up inputs)."""
DP_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard")


@dataclass(frozen=True, slots=True)
class Shape:
    """What the activations' size depends on."""

    layers: int
    hidden: int
    seq_len: int
    micro_batch_size: int = 1
    """Samples per micro-batch on one data-parallel replica."""
    micro_batches: int = 1
    activation_bytes: int = 2

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.seq_len, self.micro_batch_size, self.micro_batches,
               self.activation_bytes) < 1:
            raise ValueError(f"every shape figure must be >= 1: {self}")

    @property
    def activation_payload_bytes(self) -> int:
        """One micro-batch's activations at a layer boundary: [micro-batch, seq, hidden]."""
        return self.micro_batch_size * self.seq_len * self.hidden * self.activation_bytes


@dataclass(frozen=True, slots=True)
class GroupComm:
    """One dimension's traffic per rank per step, and its time on that dimension's link."""

    dimension: str
    """tp, pp or dp."""
    ranks: int
    """Ranks in one group of this dimension."""
    comm: CommPerStep
    link: Link
    seconds: float


@dataclass(frozen=True, slots=True)
class MeshCost:
    mesh: ParallelDims
    dp_strategy: str
    memory: MemoryPerRank
    groups: tuple[GroupComm, ...]
    bubble_fraction: float
    """Idle share of a pipeline step, (PP-1)/(PP+M-1); 0 without a pipeline."""
    layers_per_stage: int

    def group(self, dimension: str) -> GroupComm:
        return next(g for g in self.groups if g.dimension == dimension)


def check_mesh(mesh: ParallelDims, shape: Shape, dp_strategy: str = "ddp") -> str:
    """The canonical DP strategy name, or ValueError saying what does not fit together."""
    s = canonical_strategy(dp_strategy)
    if s not in DP_STRATEGIES:
        raise ValueError(f"the data-parallel strategy must be one of {', '.join(DP_STRATEGIES)}, got {dp_strategy!r}")
    if shape.hidden % mesh.tp:
        raise ValueError(f"tp ({mesh.tp}) must divide the hidden size ({shape.hidden}): each rank takes whole "
                         "columns of every matrix")
    if mesh.pp > shape.layers:
        raise ValueError(f"pp ({mesh.pp}) cannot exceed the layers ({shape.layers}): a stage holds at least one")
    return s


def tp_comm_per_step(shape: Shape, tp: int, layers_held: int, *, sequence_parallel: bool = False,
                     gloo: bool = False) -> CommPerStep:
    """A TP rank's activation all-reduces per step over its `layers_held` layers (none when tp = 1).
    With `sequence_parallel` (Megatron's arXiv 2205.05198) each becomes an all-gather and a
    reduce-scatter of the same [micro-batch, seq, hidden] tensor, which move the same bytes on a
    ring as the all-reduce (on gloo a reduce-scatter runs as an all-reduce: `gloo`)."""
    if tp == 1:
        return CommPerStep(())
    payload = TP_ALL_REDUCES_PER_LAYER * layers_held * shape.micro_batches * shape.activation_payload_bytes
    if sequence_parallel:
        return CommPerStep((
            CollectiveBytes("all_gather", payload, ring_all_gather_sent_bytes(payload, tp)),
            CollectiveBytes("reduce_scatter", payload,
                            ring_reduce_scatter_sent_bytes(payload, tp, gloo_as_all_reduce=gloo))))
    return CommPerStep((CollectiveBytes("all_reduce", payload, ring_all_reduce_sent_bytes(payload, tp)),))


def pp_comm_per_step(shape: Shape, pp: int) -> CommPerStep:
    """A middle stage's sends per step: each micro-batch's activations on, their gradients back."""
    if pp == 1:
        return CommPerStep(())
    sent = pipeline_p2p_sent_bytes(shape.activation_payload_bytes, shape.micro_batches)
    return CommPerStep((CollectiveBytes("send", sent, sent),))


def mesh_cost(model: ModelSpec, mesh: ParallelDims, shape: Shape, *, dp_strategy: str = "ddp", link_tp: Link,
              link_pp: Link, link_dp: Link) -> MeshCost:
    """Memory and traffic per rank of a TP x PP x DP layout, each dimension timed on its own link."""
    s = check_mesh(mesh, shape, dp_strategy)
    held = ModelSpec(shard_count(shard_count(model.params, mesh.pp), mesh.tp), model.param_bytes,
                     model.grad_bytes, model.optimizer_bytes_per_param)
    layers_per_stage = shard_count(shape.layers, mesh.pp)
    dp_comm = comm_per_step(s, mesh.dp, held) if mesh.dp > 1 else CommPerStep(())
    groups = []
    for dimension, ranks, comm, link in (("tp", mesh.tp, tp_comm_per_step(shape, mesh.tp, layers_per_stage), link_tp),
                                         ("pp", mesh.pp, pp_comm_per_step(shape, mesh.pp), link_pp),
                                         ("dp", mesh.dp, dp_comm, link_dp)):
        groups.append(GroupComm(dimension, ranks, comm, link, comm_time_s(comm.sent_bytes, link)))
    return MeshCost(
        mesh=mesh, dp_strategy=s, memory=memory_per_rank(s, mesh.dp, held), groups=tuple(groups),
        bubble_fraction=gpipe_bubble_fraction(mesh.pp, shape.micro_batches) if mesh.pp > 1 else 0.0,
        layers_per_stage=layers_per_stage)


ASSUMED_VOCAB = 32_000
"""Llama's vocabulary: its embedding and head, 2 x vocab x hidden, are part of the parameters."""


def assumed_shape(params: int) -> tuple[int, int]:
    """(layers, hidden) of a dense decoder of about `params` parameters, when none is given: the
    depth of the Llama / GPT-3 family at that size, and the hidden size (a multiple of 256) that
    12 x layers x hidden^2 (its blocks) + 2 x ASSUMED_VOCAB x hidden make it.
    7e9 -> 32 x 4096 (Llama-2-7B), 13e9 -> 40 x 5120 (Llama-2-13B)."""
    if params <= 0:
        raise ValueError(f"params must be > 0, got {params}")
    layers = next((depth for most, depth in ((2e8, 12), (6e8, 24), (2e9, 24), (1e10, 32), (2.5e10, 40), (5e10, 60))
                   if params <= most), 80)
    a, b = 12 * layers, 2 * ASSUMED_VOCAB
    hidden = (-b + (b * b + 4 * a * params) ** 0.5) / (2 * a)
    return layers, max(256, round(hidden / 256) * 256)
