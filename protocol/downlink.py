"""What rank 0 says to every rank without their training threads: a frame the relay sends down its
XSUB socket to each rank's telemetry socket (`Relay.send_down`), read by that socket's thread.

Only the relay can send on a rank's telemetry connection (the rank connected to it, through
CURVE unless --insecure), so a frame here came from rank 0; it is still decoded with bounds and
dropped, not obeyed, when it is not one of these."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ringtop.protocol.messages import CommandId

PREFIX = b"ringtop.down\x00"
"""Not a subscription (those start with 0 or 1), so the XSUB passes it up to every publisher."""
MAX_DOWNLINK_BYTES = 4096


class Downlink(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    action: Literal["stacks", "stop", "dump"]
    id: CommandId = ""
    """The command it serves (`stacks` answers carry it)."""
    reason: Annotated[str, msgspec.Meta(max_length=256)] = ""


_decoder = msgspec.msgpack.Decoder(Downlink)


def encode_downlink(message: Downlink) -> bytes:
    return PREFIX + msgspec.msgpack.encode(message)


def decode_downlink(frame: bytes) -> Downlink | None:
    """The message, or None for anything else (a subscription, a malformed or oversized frame)."""
    if not frame.startswith(PREFIX) or len(frame) > MAX_DOWNLINK_BYTES:
        return None
    try:
        return _decoder.decode(frame[len(PREFIX):])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
