"""The tensor-parallel plans of the hf models (Llama-like: LLAMA_PLAN, separate q, k, v; GPT-2: its
Conv1D layers, c_attn's columns reordered by rank first) and the split arithmetic every plan
shares (what a rank holds, the norms' gradient size, the residual stream sharded around the
layers). `tensor_parallel` picks the plan and holds TinyGPT's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ringtop.strategies import collective_functional


@dataclass(frozen=True)
class TensorParallelShape:
    """What the cost model needs of a tensor-parallel rank, counted in `setup` on the whole model."""

    degree: int
    params: int
    """Parameters this rank holds: the split matrices' share plus everything replicated."""
    tensors: int
    layers: int
    hidden: int
    sequence_parallel: bool = False
    norm_grad_numel: int = 0
    """Sequence parallel: elements of the norms' gradients, partial sums all-reduced each step."""


def norm_numel(layers: Any, names: tuple[str, ...]) -> int:
    """Elements of the named norms' parameters over `layers` (their gradients are partial sums)."""
    return sum(p.numel() for layer in layers for name in names for p in layer.get_submodule(name).parameters())


LLAMA_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
              "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
              "mlp.down_proj": "rowwise"}
"""A llama-like decoder layer's split: separate q, k, v (each rank whole query and key/value heads,
in order, so a rank's query heads use its own key/value heads under GQA), the SwiGLU's gate and up
by rows, the attention's and MLP's output projections by columns."""


def shard_between(first: nn.Module, last: nn.Module, tp_mesh: Any) -> None:
    """The first block takes its rank's slice of the (replicated) embeddings, a local split; the
    last block's output is all-gathered for the replicated final norm and head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module

    parallelize_module(first, tp_mesh, PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
    parallelize_module(last, tp_mesh, PrepareModuleOutput(
        output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))


def split_numel(block: nn.Module, plan: dict[str, Any]) -> int:
    """Elements the plan splits: Colwise splits weight and bias by rows; Rowwise its weight by
    columns, its bias stays whole (added once, after the all-reduce)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return sum(p.numel() for name, style in plan.items() if isinstance(style, (ColwiseParallel, RowwiseParallel))
               for pname, p in block.get_submodule(name).named_parameters()
               if isinstance(style, ColwiseParallel) or pname == "weight")


LLAMA_NORMS = ("input_layernorm", "post_attention_layernorm")


def parallelize_llama_layers(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = False
                              ) -> TensorParallelShape:
    """LLAMA_PLAN on every decoder layer, each sublayer's input declared replicated once
    (PrepareModuleInput, kept a DTensor), so the input gradients of q, k, v (and of gate, up) are
    summed as partial sums and all-reduced once: 2 all-reduces per layer each way, as TinyGPT's.
    transformers' attention infers its local head count (`view(..., -1, head_dim)`) and keeps
    heads / key-value heads, the GQA group, unchanged; nothing else is set. `sequence_parallel`:
    `llama_sequence_parallel_plan`, the residual stream sharded around the layers as TinyGPT's."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan: dict[str, Any] = {
        # the decoder layer calls self_attn(hidden_states=...), mlp(x)
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Replicate()},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "mlp": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)),
        **{name: styles[style]() for name, style in LLAMA_PLAN.items()},
    }
    if sequence_parallel:
        plan = llama_sequence_parallel_plan()
    layers = model._layers()
    total = sum(p.numel() for p in unique_tensors(model))
    split = 0
    for layer in layers:
        split += split_numel(layer, plan)
        parallelize_module(layer, tp_mesh, plan)
    if sequence_parallel:
        shard_between(layers[0], layers[-1], tp_mesh)
    collective_functional.trace_functional_collectives()
    degree = tp_mesh.size()
    return TensorParallelShape(degree=degree, params=total - split + split // degree,
                               tensors=len(unique_tensors(model)), layers=len(layers), hidden=model.spec.dims.hidden,
                               sequence_parallel=sequence_parallel,
                               norm_grad_numel=norm_numel(layers, LLAMA_NORMS) if sequence_parallel else 0)


def llama_sequence_parallel_plan() -> dict[str, Any]:
    """Sequence parallelism in a llama-like decoder layer: the RMSNorms (and residual adds) on
    each rank's slice of the tokens; each sublayer's input gathered once (PrepareModuleInput from
    Shard(1), which is q, k, v's and gate, up's `input_layouts=Shard(1)` with one all-gather, one
    reduce-scatter of its gradient, for all three or two), o and down reduce-scattered back to the
    slice (`output_layouts=Shard(1)`). Attention runs on the whole gathered sequence, so the
    rotary embeddings computed for positions 0..S-1 are each token's own."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    return {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        **{f"self_attn.{name}": ColwiseParallel() for name in ("q_proj", "k_proj", "v_proj")},
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def qkv_columns_by_rank(d_model: int, degree: int) -> torch.Tensor:
    """Column index into a q|k|v c_attn (GPT-2's Conv1D, [d, 3d]) for each column of the by-rank
    layout: column (r, part, i) of the new layout is column part·d + r·(d/degree) + i of the old,
    so each rank's block is its own heads' q|k|v, which the attention splits in three as before."""
    share = d_model // degree
    return torch.tensor([part * d_model + r * share + i for r in range(degree) for part in range(3)
                         for i in range(share)], dtype=torch.long)


def _conv1d_styles() -> tuple[type, type]:
    """Colwise and Rowwise for transformers' Conv1D (weight [in, out], y = x W + b): torch's
    styles split nn.Linear ([out, in]) only, so the dims are swapped here."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def split(module: nn.Module, mesh: Any, placements: dict[str, Any]) -> None:
        for name, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(distribute_tensor(param, mesh, [placements[name]]),
                                                         requires_grad=param.requires_grad))

    class ColwiseConv1D(ColwiseParallel):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return distribute_module(
                module, device_mesh, lambda _, m, mesh: split(m, mesh, {"weight": Shard(1), "bias": Shard(0)}),
                lambda m, inputs, mesh: self._prepare_input_fn(self.input_layouts, self.desired_input_layouts, m,
                                                               inputs, mesh),
                lambda m, outputs, mesh: self._prepare_output_fn(self.output_layouts, self.use_local_output, m,
                                                                 outputs, mesh))

    class RowwiseConv1D(RowwiseParallel):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            desired = (Shard(-1),)
            return distribute_module(
                module, device_mesh, lambda _, m, mesh: split(m, mesh, {"weight": Shard(0), "bias": Replicate()}),
                lambda m, inputs, mesh: self._prepare_input_fn(self.input_layouts, desired, m, inputs, mesh),
                lambda m, outputs, mesh: self._prepare_output_fn(self.output_layouts, self.use_local_output, m,
                                                                 outputs, mesh))

    return ColwiseConv1D, RowwiseConv1D


def parallelize_gpt2_blocks(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = False, by_rank: bool = True
                            ) -> tuple[torch.Tensor | None, TensorParallelShape]:
    """GPT-2: c_attn's columns reordered by rank unless `by_rank` is off (tensor_parallel's
    QKV_BY_HEAD; the trap: split as q|k|v, rank 0 would get q and part of k), then c_attn and
    c_fc split by columns, the two c_proj by rows; the attention splits its local block by its
    local width. `sequence_parallel`: ln_1 and ln_2 on each rank's slice of the tokens, c_attn's
    and c_fc's inputs gathered from Shard(1), the c_proj outputs reduce-scattered back, as
    TinyGPT's blocks (GPT-2's learned positions are added to the whole embeddings, before the
    first block takes its slice)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    colwise, rowwise = _conv1d_styles()
    degree = tp_mesh.size()
    d = model.spec.dims.hidden
    cols = qkv_columns_by_rank(d, degree) if by_rank else torch.arange(3 * d)
    plan: dict[str, Any] = {"attn.c_attn": colwise(), "attn.c_proj": rowwise(), "mlp.c_fc": colwise(),
                            "mlp.c_proj": rowwise()}
    if sequence_parallel:
        plan = {"ln_1": SequenceParallel(), "attn.c_attn": colwise(input_layouts=Shard(1)),
                "attn.c_proj": rowwise(output_layouts=Shard(1)), "ln_2": SequenceParallel(),
                "mlp.c_fc": colwise(input_layouts=Shard(1)), "mlp.c_proj": rowwise(output_layouts=Shard(1))}
    layers = model._layers()
    total = sum(p.numel() for p in unique_tensors(model))
    split = 0
    for layer in layers:
        attn = layer.attn
        index = cols.to(attn.c_attn.weight.device)
        attn.c_attn.weight = nn.Parameter(attn.c_attn.weight.detach().index_select(1, index))
        attn.c_attn.bias = nn.Parameter(attn.c_attn.bias.detach().index_select(0, index))
        split += split_numel(layer, plan)
        parallelize_module(layer, tp_mesh, plan)
        attn.split_size, attn.num_heads = d // degree, attn.num_heads // degree
    if sequence_parallel:
        shard_between(layers[0], layers[-1], tp_mesh)
    collective_functional.trace_functional_collectives()
    return cols if by_rank else None, TensorParallelShape(
        degree=degree, params=total - split + split // degree, tensors=len(unique_tensors(model)), layers=len(layers),
        hidden=d, sequence_parallel=sequence_parallel,
        norm_grad_numel=norm_numel(layers, ("ln_1", "ln_2")) if sequence_parallel else 0)


def unique_tensors(module: nn.Module) -> list[nn.Parameter]:
    """Each parameter once (a tied weight is one)."""
    return list({id(p): p for p in module.parameters()}.values())
