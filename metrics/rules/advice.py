"""The verdicts' advice in the run's own terms: what the user can change in this kind of run.

An agent run is changed by the agent's flags (and the UI's live switch); a script's own loop under
`ringtop.Monitor` by the settings in its code (`DistributedDataParallel(bucket_cap_mb=…)`,
`DataLoader(num_workers=…)`); a Hugging Face or Lightning run by its trainer's arguments. A flag of
the agent named to an own loop means nothing there. Pure and torch-free.
"""

from __future__ import annotations

LOOPS = ("agent", "monitor", "hf", "lightning")
"""agent: ringtop's own loop; monitor: a script's loop under ringtop.Monitor; hf, lightning: their
trainers under ringtop's callbacks."""

_BUCKETS = {
    "agent": "larger DDP buckets (--ddp-bucket-cap-mb, DDP's default 25) mean fewer, larger all-reduces",
    "monitor": "larger DDP buckets, DistributedDataParallel(model, bucket_cap_mb=…) (default 25), mean fewer, "
               "larger all-reduces",
    "hf": "larger DDP buckets, TrainingArguments(ddp_bucket_cap_mb=…) (DDP's default 25), mean fewer, larger "
          "all-reduces",
    "lightning": "larger DDP buckets, Trainer(strategy=DDPStrategy(bucket_cap_mb=…)) (DDP's default 25), mean "
                 "fewer, larger all-reduces",
}
_FEWER_EXCHANGES = {
    "agent": "a larger --batch-size: more compute per exchange",
    "monitor": "gradient accumulation: several micro-batches under model.no_sync(), one exchange per optimizer step",
    "hf": "gradient accumulation, TrainingArguments(gradient_accumulation_steps=…): one exchange per several "
          "micro-batches",
    "lightning": "gradient accumulation, Trainer(accumulate_grad_batches=…): one exchange per several micro-batches",
}
_LESS_SHARDED_HOW = {
    "agent": {"zero2": "S in the UI, or --strategy zero2", "fsdp-grad-op": "S in the UI, or --fsdp-sharding grad-op"},
    "monitor": {"fsdp-grad-op": "fully_shard(…, reshard_after_forward=False)"},
    "hf": {"fsdp-grad-op": 'TrainingArguments(fsdp="shard_grad_op")'},
    "lightning": {"fsdp-grad-op": 'FSDPStrategy(sharding_strategy="SHARD_GRAD_OP")'},
}
_INPUT = {
    "agent": "the --data function yields too slowly: build its batches with a DataLoader(num_workers=…, "
             "pin_memory=True, prefetch_factor=…) inside it, or pre-tokenise the data",
    "monitor": "more loader workers and prefetching, DataLoader(num_workers=…, pin_memory=True, prefetch_factor=…, "
               "persistent_workers=True), or pre-tokenised data",
    "hf": "more loader workers, TrainingArguments(dataloader_num_workers=…, dataloader_pin_memory=True, "
          "dataloader_prefetch_factor=…), or a pre-tokenised dataset",
    "lightning": "more loader workers in the DataLoader your module or data module returns, DataLoader(num_workers=…, "
                 "pin_memory=True, persistent_workers=True), or pre-tokenised data",
}
_MEMORY = {
    "agent": "shard more state (S in the UI, or --strategy zero2 / zero3, --strategy fsdp), or a smaller --batch-size",
    "monitor": "shard more state (fully_shard(model) instead of DDP), activation checkpointing "
               "(torch.utils.checkpoint), or a smaller batch",
    "hf": 'shard more state (TrainingArguments(fsdp="full_shard")), TrainingArguments(gradient_checkpointing=True), '
          "or a smaller per_device_train_batch_size",
    "lightning": "shard more state (Trainer(strategy=FSDPStrategy(…))), activation checkpointing "
                 "(FSDPStrategy(activation_checkpointing_policy=…)), or a smaller batch",
}


def _of(table: dict[str, str], loop: str) -> str:
    return table.get(loop, table["monitor"])


def buckets(loop: str) -> str:
    return _of(_BUCKETS, loop)


def fewer_exchanges(loop: str) -> str:
    return _of(_FEWER_EXCHANGES, loop)


def less_sharded_how(loop: str, alt: str) -> str:
    """How this kind of run moves to `alt` (a cost-model name); "" where it cannot (an own loop
    cannot become DeepSpeed ZeRO-2 by a setting)."""
    return _LESS_SHARDED_HOW.get(loop, {}).get(alt, "")


def input_stall(loop: str) -> str:
    return _of(_INPUT, loop)


def memory(loop: str) -> str:
    return _of(_MEMORY, loop)
