"""DeepSpeed ZeRO stages 1, 2 and 3 through `deepspeed.initialize`, with a torch AdamW.

Stage 1 partitions the optimizer state, stage 2 also the gradients, stage 3 also the parameters.
DeepSpeed keeps an fp32 master copy of this rank's partition beside the torch optimizer's two
moments, so its optimizer state is 12 bytes per parameter / N (the ZeRO paper's K = 12), not 8.
"""

from __future__ import annotations

import contextlib
import logging
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ringtop.strategies.base import (
    DistContext,
    ModelCall,
    OptimizerFactory,
    ShardingSpec,
    Strategy,
    StrategyError,
    TrainSettings,
    optimizer_state_tensors,
    refuse_unknown_options,
    tensor_bytes,
)
from ringtop.strategies.ds_config import DSConfigError, Owned, merge_ds_config

_MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class ZeroStrategy(Strategy):
    stage: ClassVar[int]

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_unknown_options(self.name, self.options, ("ds_config",))
        self.engine = None
        self.ds_config: dict[str, Any] = {}

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        try:
            import deepspeed  # noqa: F401
        except ImportError as exc:
            from ringtop.metrics.install_hint import install_command

            return f"DeepSpeed is not installed or does not import ({exc}); {install_command('deepspeed')}"
        return None

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext,
              settings: TrainSettings) -> None:
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        try:
            self.ds_config, _ = merge_ds_config(
                self.options.get("ds_config"), self.stage, ctx.world_size,
                Owned(settings.batch_size, settings.grad_clip, settings.dtype,
                      frozenset(("batch_size", "grad_clip", "dtype"))),
            )
        except DSConfigError as exc:
            raise StrategyError(str(exc)) from None
        self.settings = settings
        _skip_inference_shm_kernel()
        optimizer = make_optimizer(model.parameters())
        with _without_startup_waste(skip_weight_broadcast=self.weights_identical):
            self.engine, self.ds_optimizer, _, _ = deepspeed.initialize(
                model=model, optimizer=optimizer, config=self.ds_config, dist_init_required=False)

    def _zero_grad(self) -> None:
        pass  # the engine clears gradients at the end of its step

    def _forward(self, batch: Any, call_model: ModelCall) -> torch.Tensor:
        return call_model(self.engine, batch)

    def _backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def _optimizer_step(self) -> None:
        self.engine.step()  # clips to gradient_clipping (= --grad-clip) by the global norm first
        self._grad_norm = self.engine.get_global_grad_norm()

    def _count_grads(self) -> int:
        grads = self.ds_optimizer.averaged_gradients
        groups = grads.values() if isinstance(grads, dict) else grads
        return tensor_bytes(t for group in groups for t in (group or []))

    def _inner_state_bytes(self) -> int:
        return tensor_bytes(optimizer_state_tensors(self.ds_optimizer.optimizer))

    def full_state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Gathered with DeepSpeed's safe_get_full_* API, in torch's full state-dict layout."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        module = self.engine.module
        names = _names_by_param(module)
        model_state: dict[str, Any] = {}
        optim_state: dict[str, Any] = {}
        step = self._optimizer_step_count()
        for param, fqns in names:
            full = safe_get_full_fp32_param(param).detach().cpu().clone()
            for fqn in fqns:
                model_state[fqn] = full
            moments = {key: safe_get_full_optimizer_state(param, key) for key in _MOMENTS}
            if all(v is not None for v in moments.values()):
                optim_state[fqns[0]] = {"step": torch.tensor(float(step)),
                                        **{k: v.detach().cpu().clone() for k, v in moments.items()}}
        buffers = dict(module.named_buffers())
        for name, value in module.state_dict(keep_vars=True).items():  # persistent buffers only, as torch saves
            if name in buffers:
                model_state[name] = value.detach().cpu().clone()
        group = {k: v for k, v in self.ds_optimizer.optimizer.param_groups[0].items() if k != "params"}
        group["params"] = [fqns[0] for _, fqns in names]
        return model_state, {"state": optim_state, "param_groups": [group]}

    def full_state_dict_on_every_rank(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.full_state_dict()  # DeepSpeed's safe_get_full_* gather to every rank

    def load_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any], *,
                             weights_loaded: bool = False) -> None:
        self.stage_full_state_dict(model_state, optim_state, weights_loaded=weights_loaded)()

    def stage_full_state_dict(self, model_state: dict[str, Any], optim_state: dict[str, Any], *,
                              weights_loaded: bool = False) -> Callable[[], None]:
        """Checks, the weights, and the moment partitions allocated but not yet touched; the
        returned call fills the moments, consuming `optim_state`'s entries as it goes. With
        `weights_loaded` in fp32 the engine's master copy was taken from those weights at
        initialisation; in bf16 it was taken from the rounded copy, so it is written again."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        names = _names_by_param(self.engine.module)
        missing = [fqns[0] for _, fqns in names if fqns[0] not in model_state]
        if missing:
            raise StrategyError(f"the checkpoint lacks parameters {missing[:5]}")
        state = optim_state.get("state", {})
        for param, fqns in names:
            shape = tuple(getattr(param, "ds_shape", param.shape))  # ZeRO-3 keeps only a shard in param
            for key, value in state.get(fqns[0], {}).items():
                if key in _MOMENTS and tuple(value.shape) != shape:
                    raise StrategyError(f"{key} of {fqns[0]} has shape {tuple(value.shape)}, the parameter {shape}")
        step = max((float(s["step"]) for s in state.values() if "step" in s), default=0.0)
        fresh = self._create_optimizer_state(step)
        if not weights_loaded or self.settings.dtype != "fp32":
            for param, fqns in names:
                value = model_state[fqns[0]]
                safe_set_full_fp32_param(param, value.to(torch.float32))
                with torch.no_grad():
                    self._write_working_weights(param, value)

        def write_moments() -> None:
            for tensor in fresh:
                tensor.zero_()
            for param, fqns in names:
                entry = state.pop(fqns[0], {})
                for key in _MOMENTS:
                    if key in entry:
                        safe_set_full_optimizer_state(param, entry[key].to(torch.float32), key)

        return write_moments

    @abstractmethod
    def _write_working_weights(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Set the copy forward uses: DeepSpeed writes only the fp32 master, and refreshes the
        working copy from it only after the next optimizer step."""

    @abstractmethod
    def _master_partitions(self) -> list[torch.Tensor]:
        """This rank's fp32 master partitions: the tensors DeepSpeed's inner optimizer steps."""

    def _create_optimizer_state(self, step: float) -> list[torch.Tensor]:
        """The torch optimizer creates its state on its first step; a resumed or switched-to run
        needs it before the state can be written into it. Returns the moments it allocated, still
        to be zeroed: their pages are first touched then, not here."""
        inner = self.ds_optimizer.optimizer
        fresh: list[torch.Tensor] = []
        for p in self._master_partitions():
            if not inner.state.get(p):
                moments = {key: torch.empty_like(p) for key in _MOMENTS}
                inner.state[p] = {"step": torch.tensor(step), **moments}
                fresh.extend(moments.values())
            else:
                inner.state[p]["step"] = torch.tensor(step)
        self._link_optimizer_state()
        return fresh

    def _link_optimizer_state(self) -> None:
        pass

    def _optimizer_step_count(self) -> int:
        steps = [s["step"] for s in self.ds_optimizer.optimizer.state.values() if "step" in s]
        return int(float(steps[0])) if steps else 0

    def teardown(self) -> None:
        if self.engine is not None:
            self.engine.destroy()
        self.engine = None
        self.ds_optimizer = None


def _skip_inference_shm_kernel() -> None:
    """On CPU, DeepSpeed's first communication set-up compiles a shared-memory all-reduce kernel
    with the system C++ compiler (50 s on 2 cores, again whenever another environment rebuilt the
    shared extension cache, and a failure where no compiler is installed). Only
    `inference_all_reduce` uses it; training never does, so ringtop does not build it."""
    import importlib

    # not `import deepspeed.comm.torch as ...`: deepspeed.comm's attribute `torch` is torch itself
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


@contextlib.contextmanager
def _without_startup_waste(skip_weight_broadcast: bool):
    """Two things `deepspeed.initialize` does that leave nothing behind here, each paid in fresh
    memory or traffic on a switch's critical path (125m, 2 ranks: 0.25 GB, 0.8 s; 0.5 GB, 0.3 s):
    ZeRO-1/2 allocate a zero gradient for every partition and drop it again unless the optimizer
    is offloaded or Adagrad; and the engine broadcasts rank 0's weights, which a caller that loaded
    one state on every rank (`weights_identical`) already has."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    init_states = DeepSpeedZeroOptimizer.initialize_optimizer_states
    broadcast = DeepSpeedEngine._broadcast_model

    def initialize_optimizer_states(optimizer) -> None:
        if optimizer.cpu_offload or isinstance(optimizer.optimizer, torch.optim.Adagrad):
            init_states(optimizer)

    DeepSpeedZeroOptimizer.initialize_optimizer_states = initialize_optimizer_states
    if skip_weight_broadcast:
        DeepSpeedEngine._broadcast_model = lambda engine: None
    try:
        yield
    finally:
        DeepSpeedZeroOptimizer.initialize_optimizer_states = init_states
        DeepSpeedEngine._broadcast_model = broadcast


def _names_by_param(module: nn.Module) -> list[tuple[nn.Parameter, list[str]]]:
    """Each distinct parameter with all its names (a tied weight has several)."""
    by_id: dict[int, tuple[nn.Parameter, list[str]]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), (param, []))[1].append(name)
    return list(by_id.values())


@dataclass
class Zero1Strategy(ZeroStrategy):
    name = "zero1"
    stage = 1
    sharding = ShardingSpec(optimizer=True)

    def _master_partitions(self) -> list[torch.Tensor]:
        return list(self.ds_optimizer.single_partition_of_fp32_groups)

    def _write_working_weights(self, param: nn.Parameter, value: torch.Tensor) -> None:
        param.data.copy_(value.to(param.dtype))  # every rank holds the whole working copy

    def _link_optimizer_state(self) -> None:
        # Stages 1/2 map each parameter onto slices of the partition's optimizer state lazily, at
        # the first step; link them now so safe_set_full_optimizer_state can write through.
        self.ds_optimizer._hp_optimizer_states_linked = False
        self.ds_optimizer._lazy_init_hp_params_optimizer_state()

    def _count_params(self) -> int:
        return tensor_bytes(self.ds_optimizer.bit16_groups_flat)

    def _count_optimizer(self) -> int:
        return self._inner_state_bytes() + tensor_bytes(self._master_partitions())


@dataclass
class Zero2Strategy(Zero1Strategy):
    name = "zero2"
    stage = 2
    sharding = ShardingSpec(grads=True, optimizer=True)


@dataclass
class Zero3Strategy(ZeroStrategy):
    name = "zero3"
    stage = 3
    sharding = ShardingSpec(params=True, grads=True, optimizer=True)

    def _master_partitions(self) -> list[torch.Tensor]:
        return list(self.ds_optimizer.fp32_partitioned_groups_flat)

    def _write_working_weights(self, param: nn.Parameter, value: torch.Tensor) -> None:
        part = param.ds_tensor  # this rank's slice of the flattened parameter, padded at the end
        start = part.numel() * self.ds_optimizer.dp_process_group.rank()
        real = max(0, min(part.numel(), value.numel() - start))
        part.data[:real].copy_(value.flatten()[start:start + real].to(part.dtype))

    def _count_params(self) -> int:
        params = list(self.engine.module.parameters())
        return tensor_bytes(p.ds_tensor for p in params) + tensor_bytes(p.data for p in params)

    def _count_optimizer(self) -> int:
        return self._inner_state_bytes() + tensor_bytes(self._master_partitions())
