"""Encode and decode messages: MessagePack on the wire, JSON lines on disk, one schema.

Decoding validates once, on entry, and turns every kind of bad input into a `ProtocolError`
subclass that says what was wrong, so a receiver can reply or count it and carry on.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ringtop.protocol.errors import InvalidMessageError, MalformedError, OversizeError, UnknownTypeError, VersionError
from ringtop.protocol.messages import LOG_ONLY, MESSAGE_TYPES, PROTOCOL_VERSION, Event, HangReport, Message

MAX_FRAME_BYTES = 1 << 20
"""Largest message accepted on either channel; telemetry messages are a few hundred bytes."""

MAX_DEPTH = 32
"""Deepest nesting of maps and arrays accepted in a message's free-form fields (`args`, `data`,
`result`, `strategy_options`); ringtop itself sends at most 4."""

_FREE_FORM_FIELDS = {cls: tuple(n for n in ("args", "data", "result", "strategy_options") if n in cls.__struct_fields__)
                     for cls in MESSAGE_TYPES.values()}
"""Per message type, its free-form fields (most types have none: nothing to walk)."""
_MP_LEAD = {cls: b"\xa4type" + bytes([0xA0 + len(tag)]) + tag.encode() + b"\xa1v" for tag, cls in MESSAGE_TYPES.items()}
"""Per message type, how msgspec writes its first keys: the tag, then `v` (first of the envelope)."""
_MP_MAP_HEADER_BYTES = {0xDE: 3, 0xDF: 5}
"""A map16 or map32 header's length (a fixmap's is 1)."""

_mp_encoder = msgspec.msgpack.Encoder()
_mp_decoder = msgspec.msgpack.Decoder(Message)
_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(Message)


class _Header(msgspec.Struct):
    v: Any = None
    type: Any = None


_mp_header = msgspec.msgpack.Decoder(_Header)
_json_header = msgspec.json.Decoder(_Header)


def encode(msg: Message) -> bytes:
    return _mp_encoder.encode(msg)


def to_json_line(msg: Message) -> bytes:
    return _json_encoder.encode(msg) + b"\n"


LEGACY_KEYS: tuple[tuple[bytes, bytes], ...] = ((b'"comm_blocked_ms"', b'"exposed_comm_ms"'),)
"""Field names older agents wrote, as they appear in a JSON line, and today's: `Step.exposed_comm_ms`
was `comm_blocked_ms` (the same length, so a MessagePack frame is patched in place too)."""
_MP_LEGACY_KEYS = ((b"\xafcomm_blocked_ms", b"\xafexposed_comm_ms"),)


def _renamed(data: bytes, keys: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """`data` with old field names read as today's, so old logs still replay."""
    for old, new in keys:
        if old in data:
            data = data.replace(old, new)
    return data


_HANG_FIELDS = frozenset(HangReport.__struct_fields__)
_hang_json_decoder = msgspec.json.Decoder(HangReport)


def legacy_hang_report(kind: str, data: dict[str, Any]) -> HangReport | None:
    """An older agent's `data` map of a `hang` or `desync` event, read as today's `Event.hang`;
    None when it holds no reading. Validated as a new report is: through JSON, as it was logged."""
    if kind == "hang" and data.get("cleared"):
        mapped: dict[str, Any] = {"verdict": "cleared", "lasted_s": data.get("seconds", 0.0)}
    elif kind == "hang" and "verdict" in data:
        mapped = {k: v for k, v in data.items() if k in _HANG_FIELDS}
    elif kind == "desync" and "culprits" in data:
        mapped = {"verdict": "desync", "waiting": data.get("agreeing", []),
                  **{k: data[k] for k in ("culprits", "group", "step") if k in data}}
    else:
        return None
    try:
        return _hang_json_decoder.decode(_json_encoder.encode(mapped))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidMessageError(f"invalid 'event' message: its {kind} reading in `data`: {exc}") from None


def decode(data: bytes, max_bytes: int = MAX_FRAME_BYTES) -> Message:
    return _decode(_renamed(data, _MP_LEGACY_KEYS), max_bytes, _mp_decoder, _mp_header, "MessagePack", _MP_LEAD)


def from_json_line(line: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> Message:
    if isinstance(line, str):
        line = line.encode()
    return _decode(_renamed(line.rstrip(b"\r\n"), LEGACY_KEYS), max_bytes, _json_decoder, _json_header, "JSON")


def _decode(data: bytes, max_bytes: int, decoder, header_decoder, fmt: str,
            leads: dict[type, bytes] | None = None) -> Message:
    """`leads`: per type, the bytes after the map header that show `v` is there (MessagePack only):
    the decode succeeded, so they are the map's first two keys, and the header decode is spared."""
    if len(data) > max_bytes:
        raise OversizeError(f"message of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    try:
        try:
            msg = decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise _diagnose(data, exc, header_decoder, fmt) from None
        for name in _FREE_FORM_FIELDS[type(msg)]:
            value = getattr(msg, name)
            if value and _depth(value) > MAX_DEPTH:
                raise MalformedError(f"`{name}` nested deeper than {MAX_DEPTH} levels")
        if type(msg) is Event and msg.hang is None and msg.data and msg.kind in ("hang", "desync"):
            msg.hang = legacy_hang_report(msg.kind, msg.data)
            if msg.hang is not None:
                msg.data = {}
        if msg.v != PROTOCOL_VERSION:
            raise VersionError(f"protocol version {msg.v!r} is not supported (this side speaks {PROTOCOL_VERSION})")
        if not (leads is not None and data.startswith(leads[type(msg)], _MP_MAP_HEADER_BYTES.get(data[0], 1))) \
                and header_decoder.decode(data).v is None:
            # `v` has a default for senders' convenience; a receiver must not take its absence for 1.
            raise VersionError(f"message has no protocol version `v` (this side speaks {PROTOCOL_VERSION})")
        return msg
    except RecursionError:  # msgspec stops cleanly at the interpreter's recursion limit, wherever it is
        raise MalformedError(f"message nested deeper than {MAX_DEPTH} levels") from None


def _depth(value: Any) -> int:
    """Nesting depth of decoded maps and arrays, without recursion (stops past MAX_DEPTH)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_DEPTH:
                return deepest
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _diagnose(data: bytes, exc: Exception, header_decoder, fmt: str) -> Exception:
    """Say which of the envelope checks failed before blaming a field."""
    try:
        header = header_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return MalformedError(f"not a {fmt} map: {exc}")
    if type(header.v) is not int or header.v != PROTOCOL_VERSION:  # `true` and `1.0` equal 1 in Python
        return VersionError(f"protocol version {header.v!r} is not supported (this side speaks {PROTOCOL_VERSION})")
    if not isinstance(header.type, str) or header.type not in MESSAGE_TYPES:
        known = ", ".join(sorted(MESSAGE_TYPES))
        return UnknownTypeError(f"unknown message type {ascii(header.type)[:80]} (known: {known})")
    return InvalidMessageError(f"invalid {header.type!r} message: {exc}")


_LOG_ONLY_LEADS = tuple(f'{{"type":"{tag}"'.encode() for tag, cls in MESSAGE_TYPES.items() if cls in LOG_ONLY)


def log_only_line(line: bytes) -> bool:
    """A line of a log-only message as ringtop writes it (its tag first): a reader with no use for
    them (the UI's replay, `summary`) skips it without decoding it. One written otherwise is
    decoded, and then told by its type."""
    return line.startswith(_LOG_ONLY_LEADS)


def read_log(path, log_only: bool = False) -> list[Message]:
    """Every decodable message of a JSON-lines log, in file order; a torn or bad line is skipped
    (`ringtop replay` reports such lines; this is for tools that only want the data). `log_only`:
    the log-only messages too (each step's collectives), which are left out otherwise."""
    from pathlib import Path

    from ringtop.protocol.errors import ProtocolError

    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        if not log_only and log_only_line(line):
            continue
        try:
            msg = from_json_line(line)
        except ProtocolError:
            continue
        if log_only or type(msg) not in LOG_ONLY:
            out.append(msg)
    return out
