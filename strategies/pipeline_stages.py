"""The pipeline's stage pieces: a model cut into stages, the stage module, the timed stage and
schedule classes torch's pipelining runs, the timeline records, and the helpers the checkpoint
path uses to put a stage's tensors back whole."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from ringtop.metrics.costs import pipeline_schedule as ps
from ringtop.strategies.base import StrategyError
from ringtop.strategies.torch_native import _is_dtensor

TIED, TIED_COPY = "tok_emb.weight", "head.weight"
"""TinyGPT's tied pair: the embedding (first stage) and the head's copy of it (last stage)."""


class PipelineEvent(NamedTuple):
    """One forward ("F") or backward ("B") of one micro-batch on one stage; host clock
    (`time.perf_counter_ns`, comparable across processes on one Linux host)."""

    stage: int
    micro_batch: int
    kind: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class StageBubble:
    """One stage's last step, measured against the schedule's window on this rank."""

    stage: int
    stages: int
    replica: int
    schedule: str
    micro_batches: int
    window_ms: float
    """From entering the schedule to the end of the loss all-reduce that closes the pipeline's step
    (the pipeline part of the step: excludes gradient sync, optimizer and data)."""
    busy_ms: float
    forward_ms: float
    backward_ms: float
    wait_recv_ms: float
    idle_ms: float
    bubble: float
    """1 - busy / window."""
    theory: float
    """(N-1)/(N+M-1), for equal stages and free transfers, GPipe and 1F1B alike."""
    warmup: bool
    """First step after the schedule was (re)built: it includes torch's shape inference and p2p warm-up."""


def _is_builtin_transformer(model: nn.Module) -> bool:
    cls = type(model)
    return (cls.__module__ == "ringtop.agent.models.model" and cls.__qualname__ == "TinyGPT"
            and isinstance(getattr(model, "blocks", None), nn.ModuleList))


class _TinyGPTSplit:
    """The built-in model's roles for the split (an hf model brings its own, `pipeline_split()`)."""

    tied = (TIED, TIED_COPY)

    def __init__(self, model: nn.Module):
        self.model = model
        self.n_layers = len(model.blocks)
        self.max_seq_len = model.cfg.max_seq_len

    def parts(self) -> list[nn.Module]:
        m = self.model
        return [m.tok_emb, m.pos_emb, m.ln_f, m.head, *m.blocks]

    def stage_params(self, layers: range, first: bool, last: bool) -> list[nn.Parameter]:
        m = self.model
        modules = [m.blocks[i] for i in layers]
        if first:
            modules += [m.tok_emb, m.pos_emb]
        if last:
            modules.append(m.ln_f)
        params = [p for mod in modules for p in mod.parameters()]
        if last and not first:
            params.append(m.head.weight)
        return params

    def build_stage(self, layers: range, first: bool, last: bool) -> nn.Module:
        return _StageModule(self.model, layers, first, last)


def _split_of(model: nn.Module):
    """How to split `model` by layers, or a StrategyError saying why it cannot be."""
    if _is_builtin_transformer(model):
        return _TinyGPTSplit(model)
    split = getattr(model, "pipeline_split", None)
    if callable(split):
        return split()
    raise StrategyError(
        f"pp splits the built-in transformer (--model tiny-gpt) and --model hf:... architectures by their "
        f"layers; got {type(model).__module__}.{type(model).__qualname__}. Use ddp, fsdp or zero1/2/3 for a "
        "user model.")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class _StageModule(nn.Module):
    """The layers of one stage of TinyGPT, under the original model's parameter names."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb = model.tok_emb
            self.pos_emb = model.pos_emb
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        if last:
            self.ln_f = model.ln_f
            # Built on the meta device (no allocation, no draw from the global RNG), then given its weight.
            self.head = nn.Linear(model.head.in_features, model.head.out_features, bias=False, device="meta")
            if first:  # one stage: the real tie
                self.head.weight = self.tok_emb.weight
            else:
                self.head.weight = nn.Parameter(model.tok_emb.weight.detach().clone())
        self.max_seq_len = model.cfg.max_seq_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            t = x.shape[1]
            if t > self.max_seq_len:
                raise ValueError(f"sequence length {t} exceeds the model's maximum {self.max_seq_len}")
            x = self.tok_emb(x) + self.pos_emb(torch.arange(t, device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def _timed_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        """A PipelineStage that records each micro-batch's forward and backward."""

        def __init__(self, *args: Any, events: list, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.events = events

        def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
            t0 = time.perf_counter_ns()
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
            self.events.append([self.stage_index, fwd_chunk_id, ps.FORWARD, t0, time.perf_counter_ns()])
            return out

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
            t0 = time.perf_counter_ns()
            out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                             last_backward=last_backward)
            self.events.append([self.stage_index, bwd_chunk_id, ps.BACKWARD, t0, time.perf_counter_ns()])
            return out

    return TimedStage


def _schedule_class(schedule: str, micro_batches: int, stages: int):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from ringtop.strategies.collective_hooks import trace_pipeline_p2p

    trace_pipeline_p2p()

    if schedule == "gpipe":
        return ScheduleGPipe
    if micro_batches >= stages:
        return Schedule1F1B

    class Schedule1F1BFewMicroBatches(Schedule1F1B):
        """torch's Schedule1F1B refuses M < N in its constructor, but its step loop handles it
        (each stage warms up with min(M, N - s) forwards); only the constructor's check and the
        schedule picture (`pipeline_order`, which assumes M >= N) are skipped here."""

        def __init__(self, stage, n_microbatches, loss_fn=None, scale_grads=True):
            PipelineScheduleSingle.__init__(self, stage, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads)

        def _get_pipeline_order(self):
            return None

    return Schedule1F1BFewMicroBatches


def _is_split(t: torch.Tensor) -> bool:
    return _is_dtensor(t) and any(p.is_shard() for p in t.placements)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective over its mesh), a plain tensor as it is."""
    return t.full_tensor() if _is_dtensor(t) else t


def _names_by_param(module: nn.Module, with_param: bool = False):
    """Each distinct parameter with all its names, in registration order."""
    by_id: dict[int, tuple[nn.Parameter, list[str]]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), (param, []))[1].append(name)
    if with_param:
        return list(by_id.values())
    return {k: names for k, (_, names) in by_id.items()}


def _release_other_stages(parts: list[nn.Module], stage: nn.Module) -> None:
    """Free the weights of layers other stages hold: the model handed in is consumed by the split."""
    kept = {id(p) for p in stage.parameters()}
    for module in parts:
        if not any(id(p) in kept for p in module.parameters()):
            module.to("meta")
