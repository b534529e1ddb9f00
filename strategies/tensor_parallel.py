"""Tensor parallelism (Megatron's layout through DTensor's `parallelize_module`) for the built-in
TinyGPT and the hf models (Llama-like: LLAMA_PLAN, separate q, k, v; GPT-2: its Conv1D layers).
In every block the fused qkv (or q, k and v) and the MLP's up projections are split by output
(ColwiseParallel), the attention's and the MLP's output projections by input (RowwiseParallel),
so each rank computes whole heads and a slice of the MLP, and the block's two outputs are
all-reduced (2 per layer in forward, 2 in backward: their input gradients). Embeddings, norms and
the head stay whole on every rank, which all see the same batch.

The trap: a fused qkv's outputs are q|k|v. Split in N blocks, rank 0 would get half of q and part
of k, and train without an error but wrong (shared/notes/tensor-parallel-facts.md). So before it
is split TinyGPT's rows are reordered by head (each head's q, k, v together; the block reads them
that way), GPT-2's c_attn columns by rank (each rank's heads' q|k|v, which its attention splits
in three by the local width); every full state this strategy gives or takes (checkpoints,
switches) is in the plain layout of the unparallelized model.

With sequence parallelism (every model here) the residual stream between the split matrices is
sharded by sequence and the norms run on each rank's tokens; their gradients are partial sums,
all-reduced before the optimizer step (`_sum_partial_grads`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.metrics.strategy_names import strategy_label
from ringtop.strategies import collective_functional, collective_naming
from ringtop.strategies.base import (
    DistContext,
    ModelCall,
    OptimizerFactory,
    PhaseMarker,
    ShardingSpec,
    StrategyError,
    TrainSettings,
    refuse_unknown_options,
)
from ringtop.strategies.tensor_parallel_plans import (
    TensorParallelShape,
    norm_numel,
    parallelize_gpt2_blocks,
    parallelize_llama_layers,
    shard_between,
    split_numel,
    unique_tensors,
)
from ringtop.strategies.torch_native import TorchNativeStrategy, _is_dtensor

QKV_BY_HEAD = True
"""Reorder the fused qkv's rows by head (GPT-2's c_attn columns by rank) before splitting them.
Only a test turns it off, to show that the equivalence check catches the q|k|v layout trap."""


def qkv_rows_by_head(n_head: int, head_dim: int) -> torch.Tensor:
    """Row index into a q|k|v weight for each row of the by-head layout: row (h, part, i) of the
    new layout is row part·d + h·head_dim + i of the old (d = n_head·head_dim)."""
    d = n_head * head_dim
    return torch.tensor([part * d + h * head_dim + i for h in range(n_head) for part in range(3)
                         for i in range(head_dim)], dtype=torch.long)


SUM_NORM_GRADS = True
"""Sum the sequence-parallel norms' partial gradients before the optimizer step. Only a test turns
it off, to show that the equivalence check catches norms trained on one rank's tokens."""


def check_splittable(model: nn.Module, degree: int, dtype: str) -> None:
    from ringtop.agent.models.model import TinyGPT

    if dtype != "fp32":
        raise StrategyError("tensor parallelism trains in fp32 here; drop --dtype bf16")
    if isinstance(model, TinyGPT):
        if model.cfg.n_head % degree:
            raise StrategyError(f"tensor parallelism over {degree} ranks: {degree} must divide the model's "
                                f"{model.cfg.n_head} heads")
        return
    from ringtop.agent.models.hf_catalogue import tensor_parallel_refusal
    from ringtop.agent.models.hf_models import HFCausalLM

    if not isinstance(model, HFCausalLM):
        raise StrategyError("tensor parallelism splits the layers of the built-in tiny-gpt and of the hf models "
                            "(--model hf:...) only")
    refusal = tensor_parallel_refusal(model.spec, degree)
    if refusal:
        raise StrategyError(refusal)


def parallelize_blocks(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = False
                       ) -> tuple[torch.Tensor | None, TensorParallelShape]:
    """Split every block of a TinyGPT (its qkv rows first reordered by head unless QKV_BY_HEAD is
    off) or of an hf model (a GPT-2's c_attn columns first reordered by rank) over `tp_mesh`;
    returns (the reordering, or None; the rank's shape). `sequence_parallel`: see
    `_sequence_parallel_plan`, `llama_sequence_parallel_plan` and `parallelize_gpt2_blocks`."""
    from ringtop.agent.models.model import TinyGPT

    if not isinstance(model, TinyGPT):
        if model.spec.dims.model_type == "gpt2":
            return parallelize_gpt2_blocks(model, tp_mesh, sequence_parallel, QKV_BY_HEAD)
        return None, parallelize_llama_layers(model, tp_mesh, sequence_parallel)
    degree = tp_mesh.size()
    total = sum(p.numel() for p in unique_tensors(model))
    rows, split = split_tiny_gpt_blocks(list(model.blocks), model.cfg.n_head, model.cfg.d_model, tp_mesh,
                                        sequence_parallel)
    if sequence_parallel:
        _shard_the_residual_stream(model, tp_mesh)
    shape = TensorParallelShape(degree=degree, params=total - split + split // degree,
                                tensors=len(unique_tensors(model)), layers=len(model.blocks),
                                hidden=model.cfg.d_model, sequence_parallel=sequence_parallel,
                                norm_grad_numel=norm_numel(model.blocks, ("ln1", "ln2")) if sequence_parallel else 0)
    return rows, shape


def split_tiny_gpt_blocks(blocks: list[nn.Module], heads: int, d_model: int, tp_mesh: Any,
                          sequence_parallel: bool = False) -> tuple[torch.Tensor | None, int]:
    """Split TinyGPT `blocks` (all of a model's, or a pipeline stage's) over `tp_mesh`, each qkv's
    rows first reordered by head unless QKV_BY_HEAD is off (with `sequence_parallel`, the plan of
    `_sequence_parallel_plan`; the caller shards the residual stream around them); returns (the
    reordering, or None; the elements the split matrices held before the split)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    degree = tp_mesh.size()
    rows = qkv_rows_by_head(heads, d_model // heads) if QKV_BY_HEAD else None
    plan: dict[str, Any] = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(), "fc": ColwiseParallel(),
                            "fc_out": RowwiseParallel()}
    if sequence_parallel:
        plan = _sequence_parallel_plan()
    split = 0
    for block in blocks:
        if rows is not None:  # a new tensor: the given one may be another wrapping's live state
            block.qkv.weight = nn.Parameter(block.qkv.weight.detach().index_select(0, rows.to(block.qkv.weight.device)))
        block.qkv_by_head = rows is not None
        split += split_numel(block, plan)
        parallelize_module(block, tp_mesh, plan)
        block.n_head = heads // degree
    collective_functional.trace_functional_collectives()
    return rows, split


def _sequence_parallel_plan() -> dict[str, Any]:
    """Megatron's sequence parallelism (arXiv 2205.05198) in a TinyGPT block: between the split
    matrices the residual stream is sharded by sequence (Shard(1)), so the LayerNorms (and the
    residual adds) run on each rank's slice of the tokens. A Colwise input is all-gathered (its
    gradient reduce-scattered), a Rowwise output reduce-scattered (its gradient all-gathered):
    each all-reduce of [batch, seq, d] becomes an all-gather and a reduce-scatter of it, the
    same bytes on a ring. The LayerNorms' weights stay whole; their gradients are partial sums
    over the ranks' tokens, all-reduced before the optimizer step."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {"ln1": SequenceParallel(), "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)), "ln2": SequenceParallel(),
            "fc": ColwiseParallel(input_layouts=Shard(1)), "fc_out": RowwiseParallel(output_layouts=Shard(1))}


def _shard_the_residual_stream(model: nn.Module, tp_mesh: Any) -> None:
    shard_between(model.blocks[0], model.blocks[-1], tp_mesh)


QKV_DIMS = {".qkv.weight": 0, ".attn.c_attn.weight": 1, ".attn.c_attn.bias": 0}
"""The fused q|k|v tensors a reordering applies to, and along which dim (TinyGPT's rows, GPT-2's
c_attn columns and bias)."""


def relayout_qkv(state: dict[str, Any], rows: torch.Tensor | None) -> dict[str, Any]:
    """`state` (model state, or the optimizer's per-parameter state by name) with each qkv
    weight's rows taken in `rows`' order; other entries as they are."""
    if rows is None:
        return state
    out = dict(state)
    for name, value in state.items():
        dim = next((d for suffix, d in QKV_DIMS.items() if name.endswith(suffix)), None)
        if dim is None:
            continue
        if isinstance(value, torch.Tensor):
            out[name] = value.index_select(dim, rows.to(value.device))
        elif isinstance(value, dict):  # AdamW's moments have the parameter's shape, its step none
            out[name] = {k: v.index_select(dim, rows.to(v.device))
                         if isinstance(v, torch.Tensor) and v.dim() > dim else v for k, v in value.items()}
    return out


class HeadOrderedQkv:
    """What a strategy whose model went through `parallelize_blocks` adds to TorchNativeStrategy:
    full states in the plain layout (qkv rows back in q|k|v order, and in by-head order on the
    way in), the functional collectives counted, and the global gradient norm over DTensors on
    different meshes. Inert while `_rows` and `_tp_shape` are None (a strategy without --tp)."""

    _rows: torch.Tensor | None = None
    _tp_shape: TensorParallelShape | None = None

    def tensor_parallel_shape(self) -> TensorParallelShape | None:
        return self._tp_shape

    def _relayout(self, state: dict[str, Any], rows: torch.Tensor | None) -> dict[str, Any]:
        return relayout_qkv(state, rows)

    def _plain(self, state: tuple[dict[str, Any], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        model_state, optim_state = state
        if self._rows is None:
            return model_state, optim_state
        inverse = torch.argsort(self._rows)
        optim = dict(optim_state)
        if "state" in optim:
            optim["state"] = self._relayout(optim["state"], inverse)
        return self._relayout(model_state, inverse), optim

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._plain(super().full_state_dict())

    def full_state_dict_on_every_rank(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._plain(super().full_state_dict_on_every_rank())

    def sharded_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """With reordered rows, the plain full state on every rank (DCP writes each replicated
        tensor once): a by-head shard saved as is would load, under the same names and shapes,
        into another strategy's qkv in the wrong order."""
        if self._rows is None:
            return super().sharded_state_dict()
        return self.full_state_dict_on_every_rank()

    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any], *,
                             weights_loaded: bool = False) -> None:
        optim = dict(optim_state)
        if "state" in optim:
            optim["state"] = self._relayout(optim["state"], self._rows)
        model = model_state if weights_loaded else self._relayout(model_state, self._rows)
        super().load_full_state_dict(model, optim, weights_loaded=weights_loaded)

    def run_step(self, batch: Any, call_model: ModelCall, phases: PhaseMarker) -> torch.Tensor:
        if self._tp_shape is None:
            return super().run_step(batch, call_model, phases)
        with collective_functional.functional_collectives_traced():
            return super().run_step(batch, call_model, phases)

    def _optimizer_step(self) -> None:
        """The global norm over every rank's own part of each gradient (torch's get_total_norm
        cannot stack norms of DTensors on different meshes: a 2D mesh's split matrices, its dp
        sub-mesh's LayerNorms), one scalar all-reduce; clipping scales each rank's own part."""
        if self._tp_shape is None:
            return super()._optimizer_step()
        if self._tp_shape.sequence_parallel:
            _sum_partial_grads(self.model, SUM_NORM_GRADS)
        grads = [p.grad for p in unique_tensors(self.model) if p.grad is not None]
        locals_ = [_local(g) for g in grads]
        world = dist.get_world_size()
        squares = torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32).pow(2) / _copies(g, world)
                               for g, t in zip(grads, locals_)]).sum()
        if world > 1:
            dist.all_reduce(squares)
        norm = squares.sqrt()
        self._grad_norm = norm.detach()
        if self._skip_if_not_finite(norm):
            return
        if self.settings.grad_clip > 0:
            scale = torch.clamp(self.settings.grad_clip / (norm + 1e-6), max=1.0)
            for t in locals_:
                t.mul_(scale)
        self.optimizer.step()


@dataclass
class TensorParallelStrategy(HeadOrderedQkv, TorchNativeStrategy):
    name = "tp"
    sharding = ShardingSpec(params=True, grads=True, optimizer=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_unknown_options(self.name, self.options, ("degree", "sequence_parallel"))
        degree = self.options.get("degree")
        if degree is not None and not (isinstance(degree, int) and degree >= 1):
            raise StrategyError(f"tp degree must be an integer >= 1, got {degree!r}")
        sequence_parallel = self.options.get("sequence_parallel", False)
        if not isinstance(sequence_parallel, bool):
            raise StrategyError(f"tp sequence_parallel must be true or false, got {sequence_parallel!r}")

    def describe(self) -> str:
        return strategy_label(self.name, self.options)

    def live_facts(self) -> dict[str, Any]:
        if self._tp_shape is None:
            return {}
        return {"degree": self._tp_shape.degree, **({"sequence_parallel": True} if self._tp_shape.sequence_parallel
                                                    else {})}

    def data_shard(self, ctx: DistContext) -> tuple[int, int]:
        """A tensor-parallel group reads one data-parallel shard: its ranks are consecutive."""
        dims = ParallelDims.filling(ctx.world_size, tp=self.options.get("degree") or ctx.world_size)
        return dims.data_shard(ctx.rank)

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext,
              settings: TrainSettings) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        degree = self.options.get("degree") or ctx.world_size
        check_splittable(model, degree, settings.dtype)
        if degree != ctx.world_size:
            raise StrategyError(f"tp over {degree} ranks needs a world of {degree} ranks (this one has "
                                f"{ctx.world_size}); use --strategy fsdp --tp {degree} for data-parallel replicas")
        self.settings = settings
        mesh = init_device_mesh(ctx.device.type, (degree,), mesh_dim_names=("tp",))
        collective_naming.name_mesh_dimensions(mesh)
        self._rows, self._tp_shape = parallelize_blocks(model, mesh, self.options.get("sequence_parallel", False))
        self.work_split = degree
        self.model = model
        self.optimizer = make_optimizer(model.parameters())


def _copies(t: torch.Tensor, world: int) -> int:
    """Ranks that hold this same part of `t`: every rank for a plain tensor; for a DTensor the
    ranks outside its mesh (other copies of the mesh) times those its Replicate dims spread it on."""
    if not _is_dtensor(t):
        return world
    mesh = t.device_mesh
    replicated = 1
    for dim, placement in enumerate(t.placements):
        if placement.is_replicate():
            replicated *= mesh.size(dim)
    return world // mesh.size() * replicated


def _sum_partial_grads(model: nn.Module, summed: bool = True) -> None:
    """Sequence parallelism's norm gradients are each rank's tokens' share (Partial(sum)):
    all-reduced here, one per tensor, so the optimizer steps the same whole weight everywhere.
    `summed` False (a test's trap only): each rank keeps its own share as if it were the whole."""
    from torch.distributed.tensor import DTensor, Replicate

    for p in unique_tensors(model):
        g = p.grad
        if g is not None and _is_dtensor(g) and any(pl.is_partial() for pl in g.placements):
            whole = [Replicate() if pl.is_partial() else pl for pl in g.placements]
            p.grad = (g.redistribute(placements=whole) if summed
                      else DTensor.from_local(g.to_local(), g.device_mesh, whole, run_check=False))


def _local(t: torch.Tensor) -> torch.Tensor:
    if _is_dtensor(t):
        if any(p.is_partial() for p in t.placements):
            raise StrategyError("a gradient is still a partial sum after backward")
        return t.to_local()
    return t
