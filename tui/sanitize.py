"""Wire text made safe for the terminal: no control character reaches it raw.

Every string a message carries (a host, an event's text, a command id, keys and values of free-form
maps) passes through here once, as the message enters the UI; control characters (C0, DEL, C1:
escape sequences, bell, carriage return) are shown as visible `\\xNN` escapes. Newlines and tabs
become spaces: each message is drawn on one line. Markup is not a concern here: the UI draws wire
text only as `rich.text.Text`, which never parses it."""

from __future__ import annotations

import functools
import re
import typing
from typing import Any, Literal

import msgspec

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPACES = {"\n": " ", "\t": " "}


def visible(text: str) -> str:
    if text.isprintable() or not _CONTROL.search(text):  # the first: C-fast, and true of almost all
        return text
    return _CONTROL.sub(lambda m: _SPACES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def sanitized(msg: Any) -> Any:
    """`msg` with every string in it made visible (the same object when there was nothing to do).
    Runs on the receive thread for every message: nothing is built unless a string changes."""
    changes = None
    for name in _text_fields(type(msg)):
        value = getattr(msg, name)
        clean = _clean(value)
        if clean is not value:
            if changes is None:
                changes = {}
            changes[name] = clean
    return msgspec.structs.replace(msg, **changes) if changes else msg


def _visible_or_same(value: str) -> str:
    clean = visible(value)
    return value if clean == value else clean


def _clean(value: Any) -> Any:
    if type(value) is str:
        return value if value.isprintable() else _visible_or_same(value)
    if isinstance(value, msgspec.Struct):
        return sanitized(value)
    if isinstance(value, list):
        for i, v in enumerate(value):
            clean = _clean(v)
            if clean is not v:  # the first change: copy, and clean the rest into the copy
                return value[:i] + [clean] + [_clean(w) for w in value[i + 1:]]
        return value
    if isinstance(value, str):
        return _visible_or_same(value)
    if isinstance(value, dict):
        items = {(_clean(k) if isinstance(k, str) else k): _clean(v) for k, v in value.items()}
        same = all(a is b for a, b in zip(items, value)) and all(items[k] is value[k] for k in value if k in items)
        return value if same and len(items) == len(value) else items
    return value


@functools.cache
def _text_fields(cls: type) -> tuple[str, ...]:
    """The fields of a struct type that can carry wire text (checked once per type): a Step's
    numbers are skipped, its collective kinds are not."""
    return tuple(f.name for f in msgspec.structs.fields(cls) if _may_hold_text(f.type))


def _may_hold_text(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is str or tp is Any:
        return True
    if origin is Literal:
        return False  # decoding already held it to a fixed set of values
    if origin is typing.Annotated:
        return _may_hold_text(typing.get_args(tp)[0])
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return bool(_text_fields(tp))
    if origin is not None:
        return any(_may_hold_text(arg) for arg in typing.get_args(tp))
    return False
