"""A rank's Hello: what it runs (model, strategy, sharding, dtype, the mesh), what the strategy's
cost model predicts for it, and where the run is reached. Sent at start and again after a switch
or a change of micro-batches."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import torch

from ringtop.agent.config import BUILTIN_MODEL
from ringtop.agent.loop.prediction import (
    predict,
    predict_pipeline_stage,
    predict_pipeline_tensor_parallel,
    predict_tensor_parallel,
)
from ringtop.agent.loop.switch_offer import switch_unavailable
from ringtop.agent.restarts import max_restarts, restart_count
from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.protocol import Hello, Sharding

if TYPE_CHECKING:
    from ringtop.agent.loop.runner import Runner

RINGTOP_VERSION = "0.1.0"


def prediction(run: Runner) -> tuple[Any, int]:
    """(the cost model's prediction for this rank, optimizer bytes per parameter), by the shape
    the strategy has: tensor parallel, a pipeline stage (with tensor parallel inside), or 1D."""
    cfg, ctx, strategy = run.cfg, run.ctx, run.strategy
    stage = strategy.stage_size()
    tp = getattr(strategy, "tensor_parallel_shape", lambda: None)()
    if tp is not None:
        return predict_tensor_parallel(
            tp.params, tp.tensors, tp.degree, tp.layers, tp.hidden, cfg.batch_size, cfg.seq_len,
            dp=ParallelDims.filling(ctx.world_size, tp=tp.degree).dp,
            dp_strategy=cfg.canonical_strategy if cfg.strategy == "fsdp" else None,
            sequence_parallel=tp.sequence_parallel, gloo=ctx.backend == "gloo",
            norm_grad_numel=tp.norm_grad_numel if tp.sequence_parallel else None)
    if stage is not None and getattr(strategy, "tp", 1) > 1:
        return predict_pipeline_tensor_parallel(
            *stage, stage=strategy.stage_index, stages=strategy.num_stages, tp=strategy.tp,
            replicas=strategy.replicas, layers_held=len(strategy.stage_layers()), hidden=strategy.hidden,
            micro_batch_size=cfg.batch_size // strategy.micro_batches, seq_len=cfg.seq_len,
            micro_batches=strategy.micro_batches, tied_params=strategy.tied_numel)
    if stage is not None:
        return predict_pipeline_stage(*stage, ctx.world_size, strategy.num_stages,
                                      getattr(strategy, "tied", None) is not None)
    return predict(cfg.strategy, cfg.fsdp_sharding, ctx.world_size, run.param_count, run.param_tensors, cfg.dtype,
                   ctx.backend)


def hello(run: Runner) -> Hello:
    cfg, ctx = run.cfg, run.ctx
    mem_total = torch.cuda.get_device_properties(ctx.device).total_memory if ctx.device.type == "cuda" else 0
    name = cfg.model if cfg.model != BUILTIN_MODEL else f"{BUILTIN_MODEL}-{cfg.model_size}"
    sharding = run.strategy.sharding
    predicted, optimizer_bytes_per_param = prediction(run)
    return Hello(
        run_id=run.run_id, world_size=ctx.world_size, local_rank=ctx.local_rank,
        host=socket.gethostname(), pid=os.getpid(), backend=ctx.backend, device=str(ctx.device),
        strategy=run.strategy.name, strategy_options={**cfg.strategy_facts(), **run.strategy.live_facts()},
        sharding=Sharding(params=sharding.params, grads=sharding.grads, optimizer=sharding.optimizer),
        dtype=cfg.dtype, optimizer_bytes_per_param=optimizer_bytes_per_param, grad_clip=cfg.grad_clip,
        prediction=predicted, link_peak_gbps=cfg.link_gbps,
        link_peak_gbps_by_group=cfg.link_peaks_by_group, model=name, param_count=run.param_count,
        torch_version=str(torch.__version__),
        ringtop_version=RINGTOP_VERSION, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
        steps=cfg.steps, start_step=run.start_step, lr=cfg.lr, seed=cfg.seed,
        device_mem_total_bytes=mem_total, accelerator=run.accelerator, flops_per_token=run.flops.flops,
        flops_source=run.flops.source, peak_tflops=run.peak.tflops, peak_source=run.peak.source,
        tflops_ceiling=run.step_findings.ceiling.tflops, tflops_ceiling_source=run.step_findings.ceiling.source,
        process_started_ts=process_started_ts(), switch_unavailable=switch_unavailable(),
        restart_count=restart_count(os.environ), max_restarts=max_restarts(os.environ),
        restart_cause=run.restart_cause,
        publish=run.endpoints.publish, control=run.endpoints.control,
    )


def process_started_ts() -> float:
    """This process's start (Unix s), from the kernel; 0.0 where it cannot say."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: not known
        return 0.0
