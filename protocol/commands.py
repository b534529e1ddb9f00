"""The control commands and their arguments, validated once where rank 0 receives them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from ringtop.protocol.errors import BadArgumentsError, UnknownCommandError
from ringtop.protocol.messages import Command


class StatusArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


class CheckpointArgs(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["full", "sharded"] = "full"
    background: bool = msgspec.field(default=False, name="async")
    """Save without stalling training beyond staging the state in host memory."""


class StopArgs(msgspec.Struct, forbid_unknown_fields=True):
    reason: str = "stopped by user"


class SwitchArgs(msgspec.Struct, forbid_unknown_fields=True):
    strategy: Literal["ddp", "zero1", "zero2", "zero3", "fsdp", "pp", "tp"]
    fsdp_sharding: Literal["full", "grad-op", "no-shard"] | None = None
    ds_config: str | None = None
    pp_schedule: Literal["gpipe", "1f1b"] | None = None
    micro_batches: Annotated[int, msgspec.Meta(ge=1)] | None = None
    tp: Annotated[int, msgspec.Meta(ge=1, le=65536)] | None = None
    """Tensor-parallel degree: with `fsdp`, 2D (world / tp data-parallel replicas of tp groups);
    with `tp`, the degree (the world size). None: `tp` over every rank, anything else 1D."""


class SetArgs(msgspec.Struct, forbid_unknown_fields=True):
    micro_batches: Annotated[int, msgspec.Meta(ge=1)]


MAX_PROFILED_RANKS = 64


class ProfileArgs(msgspec.Struct, forbid_unknown_fields=True):
    steps: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3
    ranks: Annotated[list[Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)]],
                     msgspec.Meta(max_length=MAX_PROFILED_RANKS)] | None = None
    """The ranks that record (the others step on unprofiled); None: every rank."""
    reason: Annotated[str, msgspec.Meta(max_length=200)] = ""
    """Why (a capture on trigger says which verdict); shown with the profile's event."""


class StacksArgs(msgspec.Struct, forbid_unknown_fields=True):
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=30)] = 3.0
    """How long rank 0 waits for the ranks' answers before it replies with those it has."""


class DumpArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


COMMANDS: dict[str, type[msgspec.Struct]] = {
    "status": StatusArgs,
    "checkpoint": CheckpointArgs,
    "stop": StopArgs,
    "switch": SwitchArgs,
    "set": SetArgs,
    "profile": ProfileArgs,
    "stacks": StacksArgs,
    "dump": DumpArgs,
}

IMMEDIATE_COMMANDS = frozenset({"status", "stacks", "dump"})
"""Answered by rank 0's control thread without the training threads (`status` from a snapshot;
`stacks` and `dump` through the ranks' telemetry threads, so they work while training is stuck);
the rest wait for a step boundary on every rank."""


def validate_command(command: Command) -> Any:
    """The command's typed arguments, or a clear error naming what to fix."""
    spec = COMMANDS.get(command.cmd)
    if spec is None:
        known = ", ".join(sorted(COMMANDS))
        raise UnknownCommandError(f"unknown command {command.cmd!r} (known: {known})")
    try:
        return msgspec.convert(command.args, spec)
    except msgspec.ValidationError as exc:
        raise BadArgumentsError(f"bad arguments for {command.cmd!r}: {exc}") from None
