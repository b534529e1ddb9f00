"""Several telemetry messages in one ZeroMQ message: how a node relay forwards its ranks to the head.

A ZeroMQ message costs the head the same whatever it holds (a receive, a CURVE box, its
metadata), so a node relay sends what it has queued as one frame: a MessagePack array of binary
strings, topic, message, topic, message... (README.md, "Batches"). The head validates each message
in it as if it had come alone; a single message (2 frames: topic, message) is still accepted.
"""

from __future__ import annotations

import msgspec

from ringtop.protocol.codec import MAX_FRAME_BYTES

BATCH_MESSAGES = 64
"""Messages a node relay puts in one batch at most."""
MAX_BATCH_MESSAGES = 1024
MAX_BATCH_BYTES = 4 * MAX_FRAME_BYTES
"""A batch longer than these is refused whole (a node relay's are within 64 messages and about
2 MiB: it closes a batch once it holds a megabyte)."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[bytes])


def encode_batch(messages: list[list[bytes]]) -> bytes:
    """`messages`, [topic, message] each, as one batch frame."""
    return _encoder.encode([frame for message in messages for frame in message])


def decode_batch(frame: bytes) -> list[bytes] | None:
    """The frames of a batch, topic, message, topic, message...; None if it is not one."""
    if len(frame) > MAX_BATCH_BYTES:
        return None
    try:
        frames = _decoder.decode(frame)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if len(frames) % 2 or len(frames) > 2 * MAX_BATCH_MESSAGES:
        return None
    return frames
