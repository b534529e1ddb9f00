"""Pipeline parallelism for the built-in transformer and the Hugging Face architectures
(`--model hf:...`, agent/models/hf_models.py) through `torch.distributed.pipelining`.

The model is split by layers into `stages` (balanced by default, or `split` layers per stage):
stage 0 holds the token and position embeddings and its blocks, the last stage its blocks, the
final LayerNorm and the output head and computes the loss; each stage module keeps the original
model's parameter names (blocks sit in a ModuleDict keyed by their original index), so full
checkpoints use the model's own names and load into DDP/FSDP and back. A model other than TinyGPT
is split through its `pipeline_split()` (the same roles: its layers, what the first and last stage
hold, the tied embedding/head pair's names if any; see `_TinyGPTSplit`). Micro-batches run under
torch's ScheduleGPipe or Schedule1F1B. With more ranks than stages, the ranks form a
(replicas x stages) device mesh: rank r is stage r % S of replica r // S, and after each schedule
each stage's gradients are averaged over its replicas (one coalesced all-reduce).

3D (option `tp` = T > 1, the built-in model): a (dp, pp, tp) mesh, tensor parallelism innermost
so a stage's T ranks are consecutive (one node): rank r is tensor-parallel rank r % T of stage
(r // T) % S of replica r // (T x S). Each stage's blocks are split over its tp group as
`--strategy tp` splits them (tensor_parallel.split_tiny_gpt_blocks: qkv rows by head, Colwise /
Rowwise); embeddings, final norm and head stay whole on each of the T ranks, which all run the
same schedule on the same micro-batches and send their own full copy of the activations to the
rank with the same tp index in the next stage. Replicas average each rank's own part of its
gradients. Full states are gathered over tp (full tensors), put back in the plain q|k|v layout,
then over the stages as without tp.

The tied embedding/head weight (TinyGPT's, GPT-2's; a Llama is untied). TinyGPT uses one tensor as
token embedding (stage 0) and output projection (last stage). With S > 1 the last stage holds its
own copy, initialised from the same weight. After the schedule the two stages all-reduce (sum) the
tied weight's gradient between them, so both hold d(loss)/dW = embedding part + head part - exactly
the gradient of the shared tensor in the unsplit model. Both copies then take identical AdamW steps
from identical state and stay equal; the checkpoint takes the value and the optimizer state of
`tok_emb.weight` once (its `head.weight` entry is the last stage's copy, equal to it) and a load
sets both copies. Gradient clipping uses the global norm over all stages, counting the tied weight
once.

The loss. The last stage computes the mean token loss of each micro-batch; the step's loss is the
mean over the micro-batches (= the loss of the replica's whole batch, all micro-batches being
equal in size), sent from the last stage to the other stages of its pipeline by one 4-byte
all-reduce (the others add zero), so every rank reports its replica's true loss. That all-reduce
also closes the pipeline's step: it returns only when every stage has left the schedule.

Gradient scale. torch's schedules divide the accumulated gradients by M (`scale_grads=True`),
matching a per-micro-batch mean loss: the result is the gradient of the whole batch's mean loss.

Bubble. Each stage's forward and backward of each micro-batch is timed (host clock); the last
stage's loss counts as part of its forward. `last_timeline()` holds the last step's events,
`last_bubble()` the stage's busy / wait-to-receive / idle time and bubble against the pipeline's
window on this rank: from entering the schedule to the end of the loss all-reduce, which every stage
leaves only when the slowest has finished (`pipeline_schedule` holds the theory, the replay and
the event arithmetic). On CUDA the times are host times of issuing the work, not device times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ringtop.metrics.costs import pipeline_schedule as ps
from ringtop.metrics.parallel_dims import DIMENSIONS, ParallelDims
from ringtop.strategies import collective_functional, collective_naming
from ringtop.strategies.base import (
    CountsOwnTensors,
    DistContext,
    ModelCall,
    OptimizerFactory,
    PhaseMarker,
    ShardingSpec,
    Strategy,
    StrategyError,
    TrainSettings,
    refuse_unknown_options,
)
from ringtop.strategies.pipeline_parts import PipelineGradients, PipelineStateDicts, PipelineTimeline
from ringtop.strategies.pipeline_stages import (
    PipelineEvent,
    _names_by_param,
    _positive_int,
    _release_other_stages,
    _schedule_class,
    _split_of,
    _timed_stage_class,
    _TinyGPTSplit,
)
from ringtop.strategies.tensor_parallel import check_splittable, split_tiny_gpt_blocks

OPTIONS = ("stages", "schedule", "micro_batches", "split", "tp")


@dataclass
class PipelineStrategy(PipelineGradients, PipelineTimeline, PipelineStateDicts, CountsOwnTensors, Strategy):
    """Options: `stages` (default: world size / tp), `schedule` ("gpipe" | "1f1b", default gpipe),
    `micro_batches` (default 4; must divide the per-rank batch), `split` (layers per stage,
    default balanced), `tp` (default 1; > 1: 3D, the built-in model only). The built-in model and
    hf models. See the module docstring."""

    name: ClassVar[str] = "pp"
    takes_micro_batches: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_unknown_options(self.name, self.options, OPTIONS)
        self.options.setdefault("schedule", "gpipe")
        self.options.setdefault("micro_batches", 4)
        try:
            self.options["schedule"] = ps.check_schedule(self.options["schedule"])
        except ValueError as exc:
            raise StrategyError(f"pp: {exc}") from None
        stages = self.options.get("stages")
        if stages is not None and not _positive_int(stages):
            raise StrategyError(f"pp stages must be an integer >= 1, got {stages!r}")
        if not _positive_int(self.options["micro_batches"]):
            raise StrategyError(f"pp micro_batches must be an integer >= 1, got {self.options['micro_batches']!r}")
        split = self.options.get("split")
        if split is not None and (not isinstance(split, (list, tuple)) or not all(_positive_int(v) for v in split)):
            raise StrategyError(f"pp split must be a list of layer counts >= 1 per stage, got {split!r}")
        if not _positive_int(self.options.get("tp", 1)):
            raise StrategyError(f"pp tp must be an integer >= 1, got {self.options['tp']!r}")
        self.tp = self.options.get("tp", 1)
        self.tp_index = 0
        self.tp_group = None
        self.hidden = 0
        self.tied_numel = 0
        """With tp: the model's width and the tied weight's elements (summed between the end stages)."""
        self._rows: torch.Tensor | None = None
        """The qkv rows' by-head order of a 3D stage (None without tp, or with the trap left in)."""
        self.module: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._stage = None
        self._schedule = None
        self._events: list[list] = []
        self._last_events: list[PipelineEvent] = []
        self._window_ns = (0, 0)
        self._warmup = False
        self._fresh = True
        self._stage_size: tuple[int, int] | None = None
        self.replica = 0
        self.replicas = 1
        self.dims = ParallelDims()
        self.split: list[int] = []
        self._layers: list[range] = []
        self.tied: tuple[str, str] | None = None
        """(embedding, head copy) parameter names of a tied pair; None for an untied model."""

    # ------------------------------------------------------------------ description

    @property
    def sharding(self) -> ShardingSpec:  # type: ignore[override]
        """Stages split the layers and replicas copy a stage; with tp a stage's matrices are split too."""
        return ShardingSpec(params=True, grads=True, optimizer=True) if self.tp > 1 else ShardingSpec()

    @property
    def schedule(self) -> str:
        return self.options["schedule"]

    @property
    def micro_batches(self) -> int:
        return self.options["micro_batches"]

    def live_facts(self) -> dict[str, Any]:
        facts = {"stages": self.num_stages, "micro_batches": self.micro_batches, "schedule": self.schedule,
                 "replicas": self.replicas}
        return {**facts, "tp": self.tp} if self.tp > 1 else facts

    def describe(self) -> str:
        stages = self.options.get("stages")
        s = f"{stages} stages" if stages else "stages=world"
        replicas = f" x {self.replicas}" if self.replicas > 1 else ""
        tp = f", tp={self.tp}" if self.tp > 1 else ""
        return f"pp({self.schedule}, {s}{replicas}{tp}, M={self.micro_batches})"

    @property
    def data_parallel_rank(self) -> int:
        """Which replica's share of the global batch this rank must be fed (all stages of a replica
        get the same batch: stage 0 uses its inputs, the last stage its targets)."""
        return self.replica

    @property
    def data_parallel_size(self) -> int:
        return self.replicas

    def data_shard(self, ctx: DistContext) -> tuple[int, int]:
        return self.data_parallel_rank, self.data_parallel_size

    def stage_size(self) -> tuple[int, int] | None:
        """(parameters, tensors) this rank holds: its stage's, with tp its share of the split matrices."""
        return self._stage_size

    def stage_layers(self) -> range:
        """The transformer layers (block indices) this rank's stage holds."""
        return self._layers[self.stage_index]

    @staticmethod
    def stage_param_counts(model: nn.Module, stages: int, split: list[int] | None = None) -> list[tuple[int, int]]:
        """(parameters, parameter tensors) each stage will hold, from the unsplit model: stage 0 the
        embeddings and its layers, the last stage its layers, the final norm and the head (with a
        tied head and more than one stage, its own copy of the weight). For the memory prediction:
        bytes held = params x 4 (fp32), grads the same, AdamW 8 bytes per param + 4 per tensor (`step`)."""
        splitter = _split_of(model)
        try:
            split = (ps.check_split(split, splitter.n_layers, stages) if split
                     else ps.balanced_split(splitter.n_layers, stages))
        except ValueError as exc:
            raise StrategyError(f"pp: {exc}") from None
        out = []
        for s, layers in enumerate(ps.stage_layers(split)):
            params = splitter.stage_params(layers, s == 0, s == stages - 1)
            out.append((sum(p.numel() for p in params), len(params)))
        return out

    # ------------------------------------------------------------------ set-up

    @staticmethod
    def _check_micro_batches(micro_batches: Any, batch_size: int) -> int:
        if not _positive_int(micro_batches):
            raise StrategyError(f"micro-batches must be an integer >= 1, got {micro_batches!r}")
        if batch_size % micro_batches:
            raise StrategyError(f"micro-batches {micro_batches} does not divide the per-rank batch size {batch_size}; "
                                f"choose one of {[m for m in range(1, batch_size + 1) if batch_size % m == 0]}")
        return micro_batches

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext,
              settings: TrainSettings) -> None:
        splitter = _split_of(model)
        if settings.dtype != "fp32":
            raise StrategyError("pp trains in fp32 here; use --strategy fsdp or zero1/2/3 for --dtype bf16")
        tp = self.tp
        if tp > 1:
            if not isinstance(splitter, _TinyGPTSplit):
                raise StrategyError("pp with tp splits the built-in tiny-gpt's layers only; drop --tp or --model")
            check_splittable(model, tp, settings.dtype)
            if ctx.world_size % tp:
                raise StrategyError(f"pp with tp {tp} needs a world size it divides, not {ctx.world_size}")
        stages = self.options.get("stages") or ctx.world_size // tp
        try:
            self.dims = ParallelDims.filling(ctx.world_size, tp=tp, pp=stages)
        except ValueError:
            raise StrategyError(f"pp stages ({stages}) x tp ({tp}) must divide the number of ranks ({ctx.world_size})"
                                ) from None
        n_layers = splitter.n_layers
        self.tied = splitter.tied
        try:
            self.split = (ps.check_split(self.options["split"], n_layers, stages) if self.options.get("split")
                          else ps.balanced_split(n_layers, stages))
        except ValueError as exc:
            raise StrategyError(f"pp: {exc}") from None
        self._check_micro_batches(self.micro_batches, settings.batch_size)
        self.settings = settings
        self.ctx = ctx
        self.num_stages, self.replicas = self.dims.pp, self.dims.dp
        self.replica, self.stage_index, self.tp_index = self.dims.coords(ctx.rank)
        self._layers = ps.stage_layers(self.split)
        self._stage_size = self.stage_param_counts(model, stages, self.split)[self.stage_index]
        self._make_groups(ctx)
        cfg = getattr(model, "cfg", None)

        self._model_keys = list(model.state_dict().keys())
        self._param_fqns = list(dict.fromkeys(
            names[0] for names in _names_by_param(model).values()))  # unique params, original order
        first, last = self.stage_index == 0, self.stage_index == stages - 1
        module = splitter.build_stage(self._layers[self.stage_index], first, last).to(ctx.device)
        _release_other_stages(splitter.parts(), module)
        if tp > 1:
            self.hidden = cfg.d_model
            self.tied_numel = model.tok_emb.weight.numel() if self.num_stages > 1 else 0
            params, tensors = self._stage_size
            self._rows, split = split_tiny_gpt_blocks(list(module.blocks.values()), cfg.n_head, cfg.d_model,
                                                      self.mesh["tp"])
            self._stage_size = (params - split + split // tp, tensors)
            self.work_split = tp
        self.module = module
        self._fqn_of = {id(p): names[0] for p, names in _names_by_param(module, with_param=True)}
        self.optimizer = make_optimizer(module.parameters())
        self._build_schedule(self.micro_batches)

    def _make_groups(self, ctx: DistContext) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        dims = self.dims
        s, r = dims.pp, dims.dp
        if dims.tp > 1:
            mesh = init_device_mesh(ctx.device.type, dims.shape, mesh_dim_names=DIMENSIONS)
            self.tp_group = mesh.get_group("tp")
        else:
            mesh = init_device_mesh(ctx.device.type, dims.shape[:2], mesh_dim_names=DIMENSIONS[:2])
        self.mesh = mesh
        collective_naming.name_mesh_dimensions(mesh)
        self.pp_group = mesh.get_group("pp")
        self.dp_group = mesh.get_group("dp") if r > 1 else None
        mine = dims.group("pp", ctx.rank)
        # The tied weight's two holders: first and last stage of each replica.
        self.tie_group = None
        holds_tied = self.stage_index in (0, s - 1)
        if self.tied is None:
            pass
        elif s == 2:
            self.tie_group = self.pp_group
        elif s > 2:
            for stages in dims.groups("pp"):  # every rank takes part in creating every group
                group = dist.new_group([stages[0], stages[-1]])
                if stages == mine and holds_tied:
                    self.tie_group = group
        # A gloo group per pipeline for gathering Python objects (checkpoint, timelines).
        if ctx.backend == "gloo":
            self.object_group = self.pp_group
        else:
            self.object_group = None
            for stages in dims.groups("pp"):
                group = dist.new_group(list(stages), backend="gloo")
                if stages == mine:
                    self.object_group = group

    def _build_schedule(self, micro_batches: int) -> None:
        stage_cls = _timed_stage_class()
        self._stage = stage_cls(self.module, self.stage_index, self.num_stages, self.ctx.device,
                                group=self.pp_group, events=self._events)
        cls = _schedule_class(self.schedule, micro_batches, self.num_stages)
        self._schedule = cls(self._stage, n_microbatches=micro_batches, loss_fn=self._loss, scale_grads=True)
        self.options["micro_batches"] = micro_batches
        self._fresh = True

    def set_micro_batches(self, micro_batches: int) -> None:
        """Use M micro-batches from the next step on (call at a step boundary, on every rank).
        Raises StrategyError and changes nothing unless M is an integer >= 1 dividing the per-rank batch."""
        self._check_micro_batches(micro_batches, self.settings.batch_size)
        if self._schedule is None:
            self.options["micro_batches"] = micro_batches
            return
        self._build_schedule(micro_batches)

    # ------------------------------------------------------------------ the step

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        if self._events and self._events[-1][2] == ps.FORWARD:  # the loss is part of the last stage's F
            self._events[-1][4] = time.perf_counter_ns()
        return loss

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _forward(self, batch: Any, call_model: ModelCall) -> torch.Tensor:
        """Runs the whole schedule (every micro-batch's forward and backward) and returns the
        replica's loss on every stage. `call_model` is not used: the stages call their layers."""
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise StrategyError("pp needs (inputs, targets) batches")
        inputs, targets = batch
        first, last = self.stage_index == 0, self.stage_index == self.num_stages - 1
        self._events.clear()
        losses: list[torch.Tensor] | None = [] if last else None
        t0 = time.perf_counter_ns()
        self._schedule.step(*((inputs,) if first else ()), target=targets if last else None, losses=losses,
                            return_outputs=False)
        if last:
            loss = torch.stack([x.detach() for x in losses]).mean()
        else:
            loss = torch.zeros((), device=self.ctx.device)
        if self.num_stages > 1:
            # The loss to every stage. An all-reduce (the others add 0) rather than a broadcast: it
            # returns on every stage only once all stages have left the schedule, so the window below
            # ends where the pipeline's step ends and a stage that finished early counts its wait
            # for the others as idle, as the theory does.
            dist.all_reduce(loss, group=self.pp_group)
        self._window_ns = (t0, time.perf_counter_ns())
        self._last_events = [PipelineEvent(*e) for e in self._events]
        self._warmup, self._fresh = self._fresh, False
        return loss

    def run_step(self, batch: Any, call_model: ModelCall, phases: PhaseMarker) -> torch.Tensor:
        """With tp, DTensor's own all-reduces (the split layers' activations) are traced too."""
        if self.tp == 1:
            return super().run_step(batch, call_model, phases)
        with collective_functional.functional_collectives_traced():
            return super().run_step(batch, call_model, phases)

    def _poisoned_forward(self, batch: Any, call_model: ModelCall) -> torch.Tensor:
        """The backward runs inside the schedule, so the NaN goes in there: this stage's output of
        every micro-batch, which makes its replica's loss NaN (on the last stage, its logits)."""
        hook = self.module.register_forward_hook(lambda module, args, out: out * float("nan"))
        try:
            return self._forward(batch, call_model)
        finally:
            hook.remove()

    def teardown(self) -> None:
        if self.module is not None:
            for p in self.module.parameters():
                p.grad = None
        self.module = None
        self.optimizer = None
        self._stage = None
        self._schedule = None
