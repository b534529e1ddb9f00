"""Merging a user's DeepSpeed JSON config with what ringtop owns. Pure and torch-free.

ringtop owns the batch sizes, gradient accumulation, gradient clipping, the ZeRO stage and the
dtype, so that every strategy trains the same way. A value in the file is adopted when the user
did not set the matching ringtop option; a value that contradicts an explicit option is refused
with a message naming both. `"auto"` means "ringtop decides".
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTO = "auto"
NEVER_PRINT = 2**31 - 1

COMMAND_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "bf16", "fp16", "zero_optimization", "communication_data_type", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "zero_allow_untested_optimizer",
})
"""Top-level keys a config sent with a command may hold: they shape training, and none makes
DeepSpeed read or write a file. Everything else (flops_profiler, tensorboard, wandb, csv_monitor,
comms_logger, checkpoint, autotuning, data_efficiency, aio, ...) only from --ds-config at launch."""
COMMAND_ZERO_KEYS = frozenset({
    "stage", "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter",
    "reduce_bucket_size", "contiguous_gradients", "round_robin_gradients", "sub_group_size",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "use_multi_rank_bucket_allreduce",
})
"""`zero_optimization` keys a command may set: buckets and overlap, not offload (whose NVMe paths
DeepSpeed writes to)."""


class DSConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Owned:
    """ringtop's settings, and which of them the user typed (`explicit` holds option names)."""

    batch_size: int
    grad_clip: float
    dtype: str
    explicit: frozenset[str] = frozenset()


def load_ds_config(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise DSConfigError(f"--ds-config {path}: cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise DSConfigError(f"--ds-config {path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DSConfigError(f"--ds-config {path}: expected a JSON object at the top level")
    return data


def check_command_ds_config(cfg: dict[str, Any]) -> None:
    """Refuse, with the reason, what a config that came with a command may not hold."""
    refused = sorted(k for k in cfg if k not in COMMAND_KEYS)
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise DSConfigError("zero_optimization must be a JSON object")
    refused += sorted(f"zero_optimization.{k}" for k in zero if k not in COMMAND_ZERO_KEYS)
    for section in ("bf16", "fp16"):
        if not isinstance(cfg.get(section, {}), dict):
            raise DSConfigError(f"{section} must be a JSON object")
    if refused:
        raise DSConfigError(
            f"a DeepSpeed config sent with a command may only set keys that shape training; refused: "
            f"{', '.join(refused[:8])}{' ...' if len(refused) > 8 else ''} (keys that make DeepSpeed read or "
            "write files - profilers, monitors, offload paths - are taken only from --ds-config at launch)")


def merge_ds_config(user: dict[str, Any] | None, stage: int, world_size: int | None,
                    owned: Owned) -> tuple[dict[str, Any], Owned]:
    """The config to pass to `deepspeed.initialize`, and ringtop's settings after adopting the file's.
    `world_size` None (not known yet, when options are parsed) skips the global batch check."""
    cfg = copy.deepcopy(user or {})
    for section in ("optimizer", "scheduler"):
        if section in cfg:
            raise DSConfigError(f"--ds-config has an '{section}' section: ringtop builds a torch AdamW (--lr) "
                                "so every strategy trains alike; remove the section")
    if cfg.get("fp16", {}).get("enabled") is True:
        raise DSConfigError("--ds-config enables fp16: ringtop supports fp32 and bf16 (--dtype bf16)")

    batch_size = _adopt(cfg, "train_micro_batch_size_per_gpu", owned.batch_size, "batch_size", "--batch-size",
                        owned, int)
    grad_clip = _adopt(cfg, "gradient_clipping", owned.grad_clip, "grad_clip", "--grad-clip", owned, float)
    accumulation = cfg.get("gradient_accumulation_steps", AUTO)
    if accumulation not in (AUTO, 1):
        raise DSConfigError(f"--ds-config sets gradient_accumulation_steps={accumulation!r}: ringtop takes one "
                            "micro-batch per optimizer step; set it to \"auto\" or 1 and raise --batch-size instead")
    cfg["gradient_accumulation_steps"] = 1
    train_batch = cfg.get("train_batch_size", AUTO)
    if world_size is not None:
        if train_batch not in (AUTO, batch_size * world_size):
            raise DSConfigError(f"--ds-config sets train_batch_size={train_batch!r}, but {world_size} ranks x "
                                f"batch {batch_size} make {batch_size * world_size}; set it to \"auto\"")
        cfg["train_batch_size"] = batch_size * world_size

    bf16 = cfg.get("bf16", {}).get("enabled", AUTO)
    file_dtype = None if bf16 == AUTO else ("bf16" if bf16 else "fp32")
    if file_dtype is not None and file_dtype != owned.dtype and "dtype" in owned.explicit:
        raise DSConfigError(f"--ds-config says bf16.enabled={bf16} but --dtype {owned.dtype} was given; "
                            "make them agree")
    dtype = file_dtype if (file_dtype is not None and "dtype" not in owned.explicit) else owned.dtype
    cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": dtype == "bf16"}

    zero = cfg.setdefault("zero_optimization", {})
    file_stage = zero.get("stage", AUTO)
    if file_stage not in (AUTO, stage):
        raise DSConfigError(f"--ds-config sets zero_optimization.stage={file_stage!r} but --strategy zero{stage} "
                            "was chosen; make them agree or set it to \"auto\"")
    zero["stage"] = stage
    for key in [k for k, v in zero.items() if v == AUTO]:
        del zero[key]  # DeepSpeed's own default
    if stage == 3:
        # Keep every parameter partitioned (DeepSpeed keeps parameters under 1e5 elements whole by
        # default), so what a rank holds is what ZeRO-3's arithmetic says.
        zero.setdefault("stage3_param_persistence_threshold", 0)
    cfg["zero_allow_untested_optimizer"] = True
    cfg.setdefault("steps_per_print", NEVER_PRINT)
    cfg.setdefault("wall_clock_breakdown", False)
    return cfg, Owned(batch_size, grad_clip, dtype, owned.explicit)


def _adopt(cfg: dict[str, Any], key: str, mine: Any, option: str, flag: str, owned: Owned, kind: type) -> Any:
    value = cfg.get(key, AUTO)
    if value == AUTO:
        cfg[key] = mine
        return mine
    try:
        value = kind(value)
    except (TypeError, ValueError):
        raise DSConfigError(f"--ds-config {key}={cfg[key]!r} is not a number") from None
    if option in owned.explicit and value != mine:
        raise DSConfigError(f"--ds-config sets {key}={value} but {flag} {mine} was given; make them agree "
                            f"or set {key} to \"auto\"")
    cfg[key] = value
    return value
