"""The runner's set-up before training: the model built (or a user's factory called), its FLOPs
per token counted once, the accelerator's peak found, the data built, a checkpoint read back to
resume from. Each fills in the runner's facts (`run.flops`, `run.peak`, `run.step`, ...)."""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any

import torch

from ringtop.agent.checkpoints import format as ckpt
from ringtop.agent.config import BUILTIN_DATA, BUILTIN_MODEL
from ringtop.agent.instruments.sampler import device_name
from ringtop.agent.loop.faults import hang_in_forward, inner_module
from ringtop.agent.models.data import synthetic_batches
from ringtop.agent.models.factories import BuildContext, user_data, user_model
from ringtop.agent.models.flop_count import FlopsPerToken, counted_flops_per_token, meta_copy, tiny_gpt_flops_per_token
from ringtop.agent.models.hf_catalogue import is_hf_spec
from ringtop.agent.models.hf_catalogue import resolve as resolve_hf
from ringtop.agent.models.hf_models import HFCausalLM, build_hf_model
from ringtop.agent.models.model import MODEL_SIZES, TinyGPT, build_tiny_gpt
from ringtop.metrics.rules.peaks import compute_dtype, resolve_peak, tflops_ceiling
from ringtop.strategies.torch_native import full_optimizer_template

if TYPE_CHECKING:
    from ringtop.agent.loop.runner import Runner


def build_context(run: Runner) -> BuildContext:
    return BuildContext(
        rank=run.ctx.rank, world_size=run.ctx.world_size, batch_size=run.cfg.batch_size,
        seq_len=run.cfg.seq_len, seed=run.cfg.seed, start_step=run.start_step, device=run.ctx.device,
        samples_seen=run.samples_seen,
    )


def build_model(run: Runner) -> torch.nn.Module:
    cfg, ctx = run.cfg, run.ctx
    if cfg.model == BUILTIN_MODEL:
        model = build_tiny_gpt(cfg.model_size, cfg.seed)
    elif is_hf_spec(cfg.model):
        # On a GPU, built there; never when a caller builds under a device of its own (a switch's meta)
        on_gpu = ctx.device.type == "cuda" and torch.empty(0).device.type == "cpu"
        model = build_hf_model(resolve_hf(cfg.model), cfg.seed, ctx.device if on_gpu else None)
    else:
        torch.manual_seed(cfg.seed)
        model = user_model(cfg.model, build_context(run))
    hang = cfg.inject_hang
    if hang is not None and hang[0] == ctx.rank and hang[2] in ("forward", "gil-held"):
        hang_in_forward(inner_module(model), lambda: run.step + 1 == hang[1], gil_held=hang[2] == "gil-held",
                        queued=lambda: run.telemetry.queued if run.telemetry is not None else 0)
    return model


def flops_before_setup(run: Runner, model: torch.nn.Module) -> torch.nn.Module | None:
    """The built-in model's FLOPs per token by the formula; for another module, its meta copy to
    count once a batch is at hand. Before the strategy wraps it: a shard's parameter count or a
    wrapper's hooks (an FSDP all-gather) would be wrong to count or to run."""
    if isinstance(model, TinyGPT):
        run.flops = tiny_gpt_flops_per_token(model, run.cfg.seq_len)
        return None
    if isinstance(model, HFCausalLM):
        run.flops = FlopsPerToken(model.flops_per_token(run.cfg.seq_len), "formula 6N+12LHS")
        return None
    try:
        return meta_copy(model)
    except Exception as exc:  # a module deepcopy cannot copy
        run.flops = FlopsPerToken(0.0, f"not counted: no meta copy ({type(exc).__name__}: {exc})"[:200])
        return None


def count_flops(run: Runner, meta_model: torch.nn.Module) -> None:
    """Counts the meta copy on the first batch, which stays the first the loop trains on."""
    first = next(run.data, None)
    if first is None:
        run.flops = FlopsPerToken(0.0, "not counted: the data gave no batch")
        return
    run.data = itertools.chain([first], run.data)
    run.flops = counted_flops_per_token(meta_model, first)


def find_peak(run: Runner) -> None:
    """The accelerator's name (NVML, read once) and the dense peak MFU is measured against."""
    device = run.ctx.device
    if device.type == "cuda":
        run.accelerator = device_name(device.index or 0)
    tf32 = device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"
    dtype = compute_dtype(run.cfg.dtype, tf32)
    run.peak = resolve_peak(run.accelerator, dtype, run.cfg.peak_tflops)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    run.step_findings.ceiling = tflops_ceiling(run.peak, run.accelerator, dtype, cores)


def build_data(run: Runner) -> Any:
    cfg = run.cfg
    if cfg.data == BUILTIN_DATA:
        if cfg.model == BUILTIN_MODEL:
            vocab = MODEL_SIZES[cfg.model_size].vocab_size
        elif is_hf_spec(cfg.model):
            vocab = resolve_hf(cfg.model).dims.vocab
        else:
            vocab = 1024
        shard, shards = run.strategy.data_shard(run.ctx)
        return synthetic_batches(shard, shards, cfg.batch_size, cfg.seq_len, vocab, cfg.seed, run.samples_seen)
    return user_data(cfg.data, build_context(run))


def read_resume(run: Runner, fresh_model: torch.nn.Module):
    """(model state, optimizer state, path): the full state, from either kind of checkpoint,
    whatever strategy and world size wrote it; sets the step and the data position. None: `--resume
    auto` and no checkpoint yet, a fresh start."""
    try:
        path = ckpt.resolve(run.cfg.resume, run.cfg.checkpoint_dir)
    except ckpt.NoCheckpointYet:
        return None
    meta = ckpt.read_meta(path)
    if meta["kind"] == ckpt.FULL:
        model_state, optim_state, _ = ckpt.load_full_files(path)
    else:
        template = {"model": {k: v.detach().clone() for k, v in fresh_model.state_dict().items()},
                    "optim": full_optimizer_template(fresh_model, run.make_optimizer)}
        ckpt.load_sharded_into(path, template, group=run.io_group)
        model_state, optim_state = template["model"], template["optim"]
    run.start_step = run.step = int(meta["step"])
    run.samples_seen = int(meta.get("samples_seen", run.step * run.ctx.world_size * run.cfg.batch_size))
    return model_state, optim_state, path
