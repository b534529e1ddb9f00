"""The control commands and their arguments, validated once where rank 0 receives them."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .errors import BadArgumentsError, UnknownCommandError
from .messages import Command


class StatusArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


class CheckpointArgs(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["full"] = "full"


class StopArgs(msgspec.Struct, forbid_unknown_fields=True):
    reason: str = "stopped by user"


COMMANDS: dict[str, type[msgspec.Struct]] = {
    "status": StatusArgs,
    "checkpoint": CheckpointArgs,
    "stop": StopArgs,
}

IMMEDIATE_COMMANDS = frozenset({"status"})
"""Answered by rank 0 at once from a snapshot; the rest wait for a step boundary on every rank."""


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
