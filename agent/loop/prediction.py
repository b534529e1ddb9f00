"""The cost model's figures for this rank of this run, to publish beside the measurements.

The prediction counts what a rank holds between steps, as the agent measures it: parameters and
optimizer state after the optimizer step, gradients right after backward.
"""

from __future__ import annotations

from ringtop.metrics.costs.cost_model import (
    CollectiveBytes,
    CommPerStep,
    ModelSpec,
    comm_per_step,
    implementation_cost,
    ring_all_gather_sent_bytes,
    ring_all_reduce_sent_bytes,
    shard_count,
)
from ringtop.metrics.costs.memory_model import ADAM_STEP_BYTES, TORCH_ADAM, predicted_state
from ringtop.metrics.costs.mesh_cost import TP_ALL_REDUCES_PER_LAYER, Shape, tp_comm_per_step
from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.metrics.strategy_names import canonical_strategy
from ringtop.protocol import Prediction


def predict(strategy: str, fsdp_sharding: str, world_size: int, param_count: int, param_tensors: int,
            dtype: str, backend: str) -> tuple[Prediction, int]:
    """(prediction, optimizer bytes per parameter the model assumed): metrics.memory_model's
    `predicted_state`, the one the Memory tab, the picker and `plan` show too."""
    canonical = canonical_strategy(strategy, fsdp_sharding)
    state = predicted_state(canonical, world_size, param_count, dtype, param_tensors)
    comm = implementation_cost(canonical, world_size, param_count, dtype, gloo=backend == "gloo").comm
    memory = state.memory
    prediction = Prediction(
        params_bytes=memory.params_bytes,
        grads_bytes=memory.grads_bytes,
        optimizer_bytes=memory.optimizer_bytes,
        comm_payload_bytes={kind: c.payload_bytes for kind, c in comm.by_kind().items()},
        comm_sent_bytes=comm.sent_bytes,
        note="; ".join(state.notes),
    )
    return prediction, state.optimizer.bytes_per_param


def predict_tensor_parallel(held_params: int, held_tensors: int, degree: int, layers: int, hidden: int,
                            batch_size: int, seq_len: int, dp: int = 1, dp_strategy: str | None = None,
                            sequence_parallel: bool = False, gloo: bool = False,
                            norm_grad_numel: int | None = None) -> tuple[Prediction, int]:
    """A tensor-parallel rank holds its share of the split matrices and all of the replicated
    parameters (embeddings, LayerNorms, RowwiseParallel biases) in fp32, their gradients and AdamW
    state. Its traffic is the activations' all-reduces, 4 per layer (mesh_cost.py), plus the one
    fp32 scalar of the global gradient norm (over all ranks). With `dp_strategy` (FSDP over `dp`
    groups, 2D) that share is sharded again dp ways and moves as that strategy moves it. With
    `sequence_parallel` the all-reduces are all-gathers and reduce-scatters, plus the residual
    stream's gather for the final norm and its gradient's at the first block
    (one activation each) and the all-reduce of the norms' gradients: `norm_grad_numel` elements
    (counted from the model; by default TinyGPT's two LayerNorms a layer, weight and bias)."""
    shape = Shape(layers=layers, hidden=hidden, seq_len=seq_len, micro_batch_size=batch_size, activation_bytes=4)
    comm = {c.kind: c for c in tp_comm_per_step(shape, degree, layers, sequence_parallel=sequence_parallel,
                                                gloo=gloo).collectives}
    norm = CollectiveBytes("all_reduce", NORM_BYTES, ring_all_reduce_sent_bytes(NORM_BYTES, degree * dp))
    tp_kinds = list(comm.values())
    if sequence_parallel and degree > 1:
        boundary = SP_BOUNDARY_GATHERS * shape.activation_payload_bytes
        norms = 4 * (SP_NORM_GRADS_PER_LAYER * layers * hidden if norm_grad_numel is None else norm_grad_numel)
        tp_kinds += [CollectiveBytes("all_gather", boundary, ring_all_gather_sent_bytes(boundary, degree)),
                     CollectiveBytes("all_reduce", norms, ring_all_reduce_sent_bytes(norms, degree))]
    held = held_params
    groups: dict[str, list[CollectiveBytes]] = {"tp": tp_kinds, "": [norm]}
    if dp_strategy is not None and dp > 1:
        groups["dp"] = list(comm_per_step(dp_strategy, dp, ModelSpec(held_params, 4, 4, 8)).collectives)
        held = shard_count(held_params, dp)
    if degree * dp == 1:
        groups = {}
    step = CommPerStep(tuple(c for kinds in groups.values() for c in kinds))
    prediction = Prediction(
        params_bytes=4 * held, grads_bytes=4 * held,
        optimizer_bytes=TORCH_ADAM.bytes_per_param * held + ADAM_STEP_BYTES * held_tensors,
        comm_payload_bytes=payload_by_kind(step.collectives),
        comm_payload_bytes_by_group={g: payload_by_kind(kinds) for g, kinds in groups.items() if kinds}
        if len(groups) > 2 else {},  # 1D: the tp group is the world, every collective's group is ""
        comm_sent_bytes=step.sent_bytes,
        note=f"this rank's share of the split matrices plus the replicated parameters ({held_params:,})"
             + (f", sharded {dp} ways" if held != held_params else "")
             + (f"; traffic: {TP_ALL_REDUCES_PER_LAYER} all-gathers and reduce-scatters of [batch, seq, hidden] "
                "per layer (sequence parallel), 2 more gathers, the norms' gradients and the gradient norm's "
                "scalar" if sequence_parallel else
                f"; traffic: {TP_ALL_REDUCES_PER_LAYER} all-reduces of [batch, seq, hidden] per layer and the "
                "gradient norm's scalar"),
    )
    return prediction, TORCH_ADAM.bytes_per_param


def payload_by_kind(collectives) -> dict[str, int]:
    """Payload bytes per collective kind of a step's collectives (several of a kind added up)."""
    return {kind: c.payload_bytes for kind, c in CommPerStep(tuple(collectives)).by_kind().items()}


NORM_BYTES = 4
"""The fp32 sum of squares a tensor-parallel rank all-reduces for the global gradient norm."""
SP_BOUNDARY_GATHERS = 2
"""Sequence parallelism on TinyGPT: the last block's output gathered for the whole final LayerNorm
and head, and the first block's input gradient gathered for the whole embeddings."""
SP_NORM_GRADS_PER_LAYER = 4
"""Two LayerNorms a block, weight and bias each [hidden]: partial sums over each rank's tokens."""


def predict_pipeline_stage(stage_params: int, stage_tensors: int, world_size: int,
                           stages: int, tied: bool = True) -> tuple[Prediction, int]:
    """A pipeline stage holds its layers' parameters whole (fp32), their gradients and AdamW state;
    its replicas all-reduce those gradients. Stage sizes differ (embeddings on the first, the head's
    copy of the tied weight on the last), so they are counted from the model, not P / stages."""
    replicas = ParallelDims.filling(world_size, pp=stages).dp
    spec = ModelSpec(stage_params, 4, 4, 8)
    comm = comm_per_step("ddp", replicas, spec) if replicas > 1 else None
    prediction = Prediction(
        params_bytes=4 * stage_params, grads_bytes=4 * stage_params,
        optimizer_bytes=TORCH_ADAM.bytes_per_param * stage_params + ADAM_STEP_BYTES * stage_tensors,
        comm_payload_bytes={kind: c.payload_bytes for kind, c in comm.by_kind().items()} if comm else {},
        comm_sent_bytes=comm.sent_bytes if comm else 0,
        note=f"this stage's layers only ({stage_params:,} parameters); activations travel point to point "
             "between stages (not traced)"
             + ("; the tied embedding's gradient is summed between first and last stage" if tied else ""),
    )
    return prediction, TORCH_ADAM.bytes_per_param


def predict_pipeline_tensor_parallel(stage_params: int, stage_tensors: int, *, stage: int, stages: int, tp: int,
                                     replicas: int, layers_held: int, hidden: int, micro_batch_size: int,
                                     seq_len: int, micro_batches: int, tied_params: int) -> tuple[Prediction, int]:
    """A 3D rank (pipeline stage x tensor-parallel share x data-parallel replica) holds its stage's
    share (`stage_params`: the split matrices / tp, the rest whole) in fp32 with gradients and
    AdamW state. Per step it hands to collectives, by kind: its layers' activation all-reduces on
    the tp group (4 per layer per micro-batch, mesh_cost.py) and the gradient norm's scalar there;
    on the pp group the loss and the norm's scalars and, on the first and last stage, the tied
    weight's gradient; on the dp group its own part of its gradients; point to point, each
    micro-batch's activations and their gradients once per neighbouring stage."""
    shape = Shape(layers=max(1, layers_held), hidden=hidden, seq_len=seq_len, micro_batch_size=micro_batch_size,
                  micro_batches=micro_batches, activation_bytes=4)
    groups: dict[str, list[CollectiveBytes]] = {"tp": [
        *tp_comm_per_step(shape, tp, layers_held).collectives,
        CollectiveBytes("all_reduce", NORM_BYTES, ring_all_reduce_sent_bytes(NORM_BYTES, tp))]}
    if stages > 1:
        # the loss to every stage, the norm's sum over stages; the tied weight's gradient between the ends
        pp = groups["pp"] = [CollectiveBytes("all_reduce", NORM_BYTES, ring_all_reduce_sent_bytes(NORM_BYTES, stages))
                             for _ in range(2)]
        if tied_params and stage in (0, stages - 1):
            pp.append(CollectiveBytes("all_reduce", 4 * tied_params, ring_all_reduce_sent_bytes(4 * tied_params, 2)))
        neighbours = 1 if stage in (0, stages - 1) else 2
        p2p = neighbours * 2 * micro_batches * shape.activation_payload_bytes
        groups[""] = [CollectiveBytes("p2p", p2p, p2p // 2)]
    if replicas > 1:
        groups["dp"] = list(comm_per_step("ddp", replicas, ModelSpec(stage_params, 4, 4, 8)).collectives)
    step = CommPerStep(tuple(c for kinds in groups.values() for c in kinds))
    prediction = Prediction(
        params_bytes=4 * stage_params, grads_bytes=4 * stage_params,
        optimizer_bytes=TORCH_ADAM.bytes_per_param * stage_params + ADAM_STEP_BYTES * stage_tensors,
        comm_payload_bytes=payload_by_kind(step.collectives),
        comm_payload_bytes_by_group={g: payload_by_kind(kinds) for g, kinds in groups.items()},
        comm_sent_bytes=step.sent_bytes,
        note=f"this stage's layers, their split matrices 1/{tp} ({stage_params:,} parameters); traffic: "
             f"{TP_ALL_REDUCES_PER_LAYER} all-reduces of [micro-batch, seq, hidden] per layer and micro-batch on "
             "tp, the stages' activations point to point, the gradients over the replicas",
    )
    return prediction, TORCH_ADAM.bytes_per_param
