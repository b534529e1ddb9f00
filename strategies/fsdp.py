"""FSDP2 (`fully_shard`), per transformer block, with the chapter's three sharding strategies:
full (FULL_SHARD ~ ZeRO-3), grad-op (SHARD_GRAD_OP ~ ZeRO-2: parameters stay gathered from
forward to backward) and no-shard (NO_SHARD ~ DDP: a replicate-only mesh)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.metrics.strategy_names import strategy_label
from ringtop.strategies import collective_naming
from ringtop.strategies.base import (
    DistContext,
    OptimizerFactory,
    ShardingSpec,
    StrategyError,
    TrainSettings,
    refuse_unknown_options,
)
from ringtop.strategies.tensor_parallel import HeadOrderedQkv, check_splittable, parallelize_blocks
from ringtop.strategies.torch_native import TorchNativeStrategy

SHARDINGS = {
    "full": ShardingSpec(params=True, grads=True, optimizer=True),
    "grad-op": ShardingSpec(params=True, grads=True, optimizer=True),
    "no-shard": ShardingSpec(),
}


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers to wrap one by one: the first ModuleList found (blocks, layers, h...)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            return list(module)
    return []


@dataclass
class FSDPStrategy(HeadOrderedQkv, TorchNativeStrategy):
    """With option `tp` > 1, 2D: a ("dp", "tp") mesh, each block split over "tp" as
    `--strategy tp` splits it, then fully sharded over "dp"."""

    name = "fsdp"
    takes_meta_model = True

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_unknown_options(self.name, self.options, ("sharding", "tp"))
        self.options.setdefault("sharding", "full")
        if self.options["sharding"] not in SHARDINGS:
            raise StrategyError(f"fsdp sharding {self.options['sharding']!r} is not one of {', '.join(SHARDINGS)}")
        tp = self.options.get("tp", 1)
        if not (isinstance(tp, int) and tp >= 1):
            raise StrategyError(f"fsdp tp must be an integer >= 1, got {tp!r}")
        if tp > 1 and self.options["sharding"] == "no-shard":
            raise StrategyError("fsdp with tp shards over the data-parallel ranks: use sharding full or grad-op")

    def data_shard(self, ctx: DistContext) -> tuple[int, int]:
        """A tensor-parallel group (consecutive ranks) reads one data-parallel shard."""
        tp = self.options.get("tp", 1)
        return ParallelDims.filling(ctx.world_size, tp=tp).data_shard(ctx.rank)

    @property
    def sharding(self) -> ShardingSpec:  # type: ignore[override]
        return SHARDINGS[self.options["sharding"]]

    def describe(self) -> str:
        return strategy_label(self.name, self.options)

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, ctx: DistContext,
              settings: TrainSettings) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.settings = settings
        sharding = self.options["sharding"]
        tp = self.options.get("tp", 1)
        if tp > 1:
            check_splittable(model, tp, settings.dtype)
            try:
                dims = ParallelDims.filling(ctx.world_size, tp=tp)
            except ValueError:
                raise StrategyError(f"fsdp with tp {tp} needs a world size it divides, not {ctx.world_size}") from None
            mesh_2d = init_device_mesh(ctx.device.type, (dims.dp, dims.tp), mesh_dim_names=("dp", "tp"))
            self._rows, self._tp_shape = parallelize_blocks(model, mesh_2d["tp"])
            self.work_split = tp
            mesh = mesh_2d["dp"]
        elif sharding == "no-shard":
            mesh = init_device_mesh(ctx.device.type, (ctx.world_size, 1), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        collective_naming.name_mesh_dimensions(mesh_2d if tp > 1 else mesh)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if settings.dtype == "bf16" else MixedPrecisionPolicy()
        reshard = sharding != "grad-op"
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        if any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers())):
            model.to_empty(device=ctx.device)  # only this rank's shards are allocated
        self.model = model
        self.optimizer = make_optimizer(model.parameters())
