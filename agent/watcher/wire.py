"""What rank 0 and its node's watcher say to each other over the watcher's stdin and stdout: one
pipe each way, so the run's secret keys never appear on a command line or in a file, and the
watcher knows at once when rank 0 is gone (its stdin ends). Frames are a 4-byte length and a
MessagePack body, bounded; a frame that does not decode ends the link, as a closed pipe would."""

from __future__ import annotations

import os
import struct
from typing import Any, Literal, Union

import msgspec

from ringtop.protocol import Endpoints, HangReport, curve
from ringtop.protocol.connection_file import ConnectionInfo

MAX_FRAME_BYTES = 16 << 20
_LENGTH = struct.Struct(">I")


class Setup(msgspec.Struct, tag="setup", kw_only=True):
    """Everything a watcher needs: on the head node (`role` "head") to take rank 0's relay half
    (agent/head/relay_services.py); on another node ("node") to run its node relay
    (agent/transport/node_relay.py) to `head_relay` with `node_keys`, for `ranks`."""

    role: Literal["head", "node"] = "head"
    endpoints: Endpoints = Endpoints()
    run_id: str
    world_size: int
    head_relay: str = ""
    node_keys: curve.ClientKeys | None = None
    ranks: list[int] = []
    rank_public: dict[int, str] = {}
    keys: curve.RunKeys | None = None
    movable: list[str] = []
    metrics: tuple[str, int] | None = None
    carriers: dict[str, list[int]] = {}
    capture_on: list[str] = []
    capture_every_min: float = 10.0
    capture_steps: int = 3
    alert_webhook: str = ""
    alert_command: str = ""
    alert_goodput: float = 0.0
    log_dir: str = ""
    attempt: int = 0
    grace_s: float = 3.0
    """After every rank of its node has ended, how long the watcher stays (the last messages out)."""


class Ready(msgspec.Struct, tag="ready", kw_only=True):
    publish: str = ""
    relay: str = ""
    server_public: str = ""
    """A node relay's public key, which its ranks connect with."""
    error: str = ""
    """Non-empty: the watcher could not bind; rank 0 raises it as its own would have been."""


class Call(msgspec.Struct, tag="call", kw_only=True):
    id: int
    op: Literal["down", "stacks_open", "stacks_poll", "state", "connection_write", "connection_remove", "stop",
                "kill_relay"]
    frame: bytes = b""
    text: str = ""
    number: float = 0.0
    info: ConnectionInfo | None = None


class Answer(msgspec.Struct, tag="answer", kw_only=True):
    id: int
    value: Any = None


class Say(msgspec.Struct, tag="say", kw_only=True):
    """A verdict or warning of the watcher's services, for rank 0 to send as its own Event."""

    level: str
    kind: str
    text: str
    data: dict[str, Any] = {}
    hang: HangReport | None = None


class Inject(msgspec.Struct, tag="inject", kw_only=True):
    """A command of the run's own (a capture on trigger), for rank 0's control server."""

    cmd: str
    args: dict[str, Any] = {}


ToWatcher = Union[Setup, Call]
FromWatcher = Union[Ready, Answer, Say, Inject]
_encoder = msgspec.msgpack.Encoder()
_to_watcher = msgspec.msgpack.Decoder(ToWatcher)
_from_watcher = msgspec.msgpack.Decoder(FromWatcher)


class LinkClosed(EOFError):
    """The other end is gone, or said something that is not a frame of this link."""


def write_frame(fd: int, message: Any) -> None:
    body = _encoder.encode(message)
    data = _LENGTH.pack(len(body)) + body
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise LinkClosed("the link's pipe ended")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read(fd: int, decoder: msgspec.msgpack.Decoder) -> Any:
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise LinkClosed(f"a frame of {length} bytes (at most {MAX_FRAME_BYTES})")
    try:
        return decoder.decode(_read_exactly(fd, length))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise LinkClosed(f"a frame that does not decode: {exc}") from None


def read_to_watcher(fd: int) -> ToWatcher:
    return _read(fd, _to_watcher)


def read_from_watcher(fd: int) -> FromWatcher:
    return _read(fd, _from_watcher)
