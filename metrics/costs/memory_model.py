"""State memory per rank, defined once: what a rank holds of parameters, gradients and optimizer
state under each strategy, for the agent's prediction (Hello.prediction), the Memory tab (its
`pred` row and the fit table), the switch picker and `ringtop plan`. Torch-free, stdlib only.

Units: bytes (`*_bytes`); shown in binary units (MiB/GiB, metrics.fmt.nbytes) everywhere. Window:
none, a rank's state between steps (after the optimizer step, gradients as backward left them),
which is what the agent measures and the Memory tab holds the prediction against.

Optimizer state (bytes per parameter), per model, each named on every screen that uses it:
- `chapter`: 4 x the parameter bytes (8 with bf16 params): the optimizer-state model of
  ../shared/seed/distributed-training-basics.zh.txt (the ZeRO chapter), whose memory table
  `ringtop plan --optimizer-state chapter` reproduces;
- `torch-adam`: torch's Adam/AdamW on fp32 parameters: two fp32 moments, 2 x 4 = 8 B/param (plus a
  4-byte `step` per parameter tensor), what ringtop's DDP, FSDP and pipeline strategies hold;
- `deepspeed-adam`: DeepSpeed's mixed-precision Adam: an fp32 master copy and two fp32 moments,
  3 x 4 = 12 B/param (the ZeRO paper's K = 12), with params and grads in the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtop.metrics.parallel_dims import ParallelDims
from ringtop.metrics.strategy_names import canonical_strategy

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the cost depends on: parameter count and bytes per parameter of each kind of state.

    `optimizer_bytes_per_param` is one of the optimizer-state models below (OPTIMIZER_STATES): the
    chapter's 4 x the param bytes, torch Adam's fp32 moments (8), DeepSpeed's fp32 master weights
    and moments (12, the ZeRO paper's K).
    """

    params: int
    param_bytes: int = 2
    grad_bytes: int = 2
    optimizer_bytes_per_param: int = 8

    def __post_init__(self) -> None:
        if self.params < 0 or self.param_bytes < 0 or self.grad_bytes < 0 or self.optimizer_bytes_per_param < 0:
            raise ValueError(f"model sizes must be >= 0: {self}")

    @classmethod
    def from_dtype(cls, params: int, dtype: str = "bf16", optimizer_bytes_per_param: int = 8) -> ModelSpec:
        """Params and grads in `dtype` (fp32 = 4 bytes, bf16/fp16 = 2)."""
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
        return cls(params, DTYPE_BYTES[dtype], DTYPE_BYTES[dtype], optimizer_bytes_per_param)


@dataclass(frozen=True, slots=True)
class Sharding:
    """Which state a strategy divides across its data-parallel ranks."""

    params: bool = False
    grads: bool = False
    optimizer: bool = False


@dataclass(frozen=True, slots=True)
class MemoryPerRank:
    """State bytes one rank holds (activations and buffers are not included)."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


_SHARDING: dict[str, Sharding] = {
    "ddp": Sharding(),
    "zero1": Sharding(optimizer=True),
    "zero2": Sharding(grads=True, optimizer=True),
    "zero3": Sharding(params=True, grads=True, optimizer=True),
    "fsdp-full": Sharding(params=True, grads=True, optimizer=True),    # FULL_SHARD ~ ZeRO-3
    "fsdp-grad-op": Sharding(grads=True, optimizer=True),              # SHARD_GRAD_OP ~ ZeRO-2
    "fsdp-no-shard": Sharding(),                                        # NO_SHARD = DDP
    "pp": Sharding(),  # each stage replicated across its data-parallel group (DDP inside a stage)
    "tp": Sharding(params=True, grads=True, optimizer=True),  # each layer's matrices split (mesh_cost.py)
}


def sharding_of(strategy: str) -> Sharding:
    """What `strategy` divides by N (the chapter's Stage 0-3 table)."""
    return _SHARDING[canonical_strategy(strategy)]


def shard_count(total: int, parts: int) -> int:
    """The largest of `parts` even shards of `total` items (ceil): padding makes shards equal."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    return -(-total // parts)


def _check_ranks(ranks: int, pp_stages: int) -> int:
    """Data-parallel degree: ranks / pipeline stages (must divide)."""
    return ParallelDims.filling(ranks, pp=pp_stages).dp


def memory_per_rank(strategy: str, ranks: int, model: ModelSpec, *, pp_stages: int = 1) -> MemoryPerRank:
    """State bytes per rank: replicated components hold all P, sharded ones ceil(P/N).

    Chapter, 7B (taken as P = 7.6e9: its 15.2 GB is 7.6e9 x 2 bytes in decimal GB; 7e9 params
    would give 14.0 GB, and GiB would make it smaller, not larger), N = 8, 2+2+8 bytes/param:
      DDP    15.2 + 15.2 + 60.8 = 91.2 GB (the chapter writes "~95"; its own parts sum to 91.2)
      ZeRO-1 15.2 + 15.2 + 7.6  = 38.0
      ZeRO-2 15.2 + 1.9  + 7.6  = 24.7
      ZeRO-3 1.9  + 1.9  + 7.6  = 11.4
    ZeRO paper Fig. 1, Psi = 7.5e9, N = 64, 2+2+12 bytes/param: 16 Psi = 120 GB; 4 Psi + 12 Psi/64
    = 31.4; 2 Psi + 14 Psi/64 = 16.6; 16 Psi/64 = 1.9 GB.

    `pp` (with `pp_stages` S): each rank holds one stage, P/S parameters with all their state
    (layers split evenly is assumed), replicated over the ranks/S data-parallel copies of a stage.
    """
    s = canonical_strategy(strategy)
    stages = pp_stages if s == "pp" else 1
    dp = _check_ranks(ranks, stages)
    params = shard_count(model.params, stages)
    sh = _SHARDING[s]

    def held(sharded: bool) -> int:
        return shard_count(params, dp) if sharded else params

    return MemoryPerRank(
        params_bytes=held(sh.params) * model.param_bytes,
        grads_bytes=held(sh.grads) * model.grad_bytes,
        optimizer_bytes=held(sh.optimizer) * model.optimizer_bytes_per_param,
    )


@dataclass(frozen=True, slots=True)
class OptimizerState:
    """One model of optimizer state: its bytes per parameter and the words that say which it is."""

    key: str
    bytes_per_param: int
    words: str
    """Plain words for a screen: `torch Adam fp32 moments (2 × 4 B/param)`."""
    short: str = ""
    """The same for a table cell: `torch Adam 8 B/param`."""


TORCH_ADAM = OptimizerState("torch-adam", 8, "torch Adam fp32 moments (2 × 4 B/param)", "torch Adam 8 B/param")
DEEPSPEED_ADAM = OptimizerState("deepspeed-adam", 12, "DeepSpeed fp32 master weights + Adam moments (3 × 4 B/param)",
                                "DeepSpeed 12 B/param")


def chapter_optimizer_state(param_bytes: int) -> OptimizerState:
    """The chapter's model (seed/distributed-training-basics.zh.txt): optimizer = 4 x parameter bytes."""
    return OptimizerState("chapter", 4 * param_bytes,
                          f"4 × param bytes ({4 * param_bytes} B/param), the model of the ZeRO chapter of "
                          "distributed-training-basics.zh.txt",
                          f"chapter 4×param {4 * param_bytes} B/param")


def given_optimizer_state(bytes_per_param: int) -> OptimizerState:
    """--optimizer-bytes: the user's own figure for every strategy."""
    return OptimizerState("given", bytes_per_param, f"{bytes_per_param} B/param as given",
                          f"given {bytes_per_param} B/param")


ADAM_STEP_BYTES = 4
"""torch's AdamW keeps `step` as a float32 scalar tensor per parameter tensor it updates; DeepSpeed
keeps one for its flat partition."""


def optimizer_state_of(strategy: str) -> OptimizerState:
    """The optimizer-state model of ringtop's own implementation of `strategy`."""
    return DEEPSPEED_ADAM if canonical_strategy(strategy).startswith("zero") else TORCH_ADAM


def implementation_specs(strategy: str, param_count: int, dtype: str = "fp32") -> tuple[ModelSpec, ModelSpec]:
    """(state, wire) of ringtop's own implementation of a strategy.

    State: DeepSpeed keeps params and grads in the compute dtype beside its fp32 master partition
    and moments (DEEPSPEED_ADAM); the torch strategies keep fp32 params and grads (mixed precision
    casts on the fly) and TORCH_ADAM. Wire: parameters travel in the compute dtype; torch
    strategies reduce gradients in fp32 (FSDP's reduce_dtype), DeepSpeed in the compute dtype.
    """
    compute = DTYPE_BYTES.get(dtype.lower(), 4)
    k = optimizer_state_of(strategy).bytes_per_param
    if canonical_strategy(strategy).startswith("zero"):
        return ModelSpec(param_count, compute, compute, k), ModelSpec(param_count, compute, compute, k)
    return ModelSpec(param_count, 4, 4, k), ModelSpec(param_count, compute, 4, k)


@dataclass(frozen=True, slots=True)
class StatePrediction:
    """What one rank of ringtop's implementation holds between steps, and why where it is not the
    strategy's textbook sharding."""

    memory: MemoryPerRank
    optimizer: OptimizerState
    notes: tuple[str, ...] = ()


def predicted_state(strategy: str, ranks: int, param_count: int, dtype: str = "fp32",
                    param_tensors: int = 0) -> StatePrediction:
    """The one memory prediction of a data-parallel strategy for agent, Memory tab, fit table,
    picker and `plan`: state bytes per rank between steps, as the agent measures them.

    Two strategies hold less between steps than their sharding words say: DeepSpeed's stage 1 keeps
    only its partition of the reduced gradients (as stage 2 does), and FSDP's SHARD_GRAD_OP
    reshards its parameters after backward (they are whole only from forward to backward). The
    optimizer adds AdamW's step counters (ADAM_STEP_BYTES per tensor; one for DeepSpeed's flat
    partition) when `param_tensors` is known.
    """
    s = canonical_strategy(strategy)
    spec, _ = implementation_specs(s, param_count, dtype)
    m = memory_per_rank(s, ranks, spec)
    notes = []
    params_bytes, grads_bytes = m.params_bytes, m.grads_bytes
    if s == "zero1":
        grads_bytes = memory_per_rank("zero2", ranks, spec).grads_bytes
        notes.append("DeepSpeed's stage 1 keeps only this rank's partition of the reduced gradients after "
                     "backward; full gradients live only in its reduce buckets during backward")
    if s == "fsdp-grad-op":
        params_bytes = memory_per_rank("fsdp-full", ranks, spec).params_bytes
        notes.append("SHARD_GRAD_OP holds whole parameters only from forward to backward; between steps "
                     "they are sharded")
    deepspeed = s.startswith("zero")
    counters = ((1 if deepspeed else param_tensors) * ADAM_STEP_BYTES) if param_tensors else 0
    if counters:
        notes.append(f"optimizer includes {counters} bytes of AdamW step counters")
    optimizer = optimizer_state_of(s)
    notes.append(f"optimizer: {optimizer.words}")
    return StatePrediction(MemoryPerRank(params_bytes, grads_bytes, m.optimizer_bytes + counters), optimizer,
                           tuple(notes))
