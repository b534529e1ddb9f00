"""Text made safe for a terminal, for the UI and the CLI alike: no control character reaches it raw.

Every string a message carries (a host, an event's text, a command id, keys and values of free-form
maps) passes through `sanitized` once, as the message enters the UI; everything the `ringtop`
command prints passes through `printable` (cli/terminal.py). Control characters (C0, DEL, C1:
escape sequences, bell, carriage return) and the bidirectional overrides and isolates (which
reorder what a reader sees, "Trojan Source") are shown as visible `\\xNN` / `\\uNNNN` escapes.
In the UI newlines and tabs become spaces (each message is drawn on one line); printed text keeps
them. Markup is not a concern here: the UI draws wire text only as `rich.text.Text`, which never
parses it."""

from __future__ import annotations

import functools
import re
import typing
from typing import Any, Literal

import msgspec

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0, DEL, C1, and the bidi embeddings, overrides and isolates (U+202A-E, U+2066-9)."""
_PRINTED_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""The same, less newline and tab: printed text keeps its lines and columns."""
_SPACES = {"\n": " ", "\t": " "}


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """One line for the UI: newlines and tabs as spaces, every other control character escaped."""
    if text.isprintable() or not _CONTROL.search(text):  # the first: C-fast, and true of almost all
        return text
    return _CONTROL.sub(lambda m: _SPACES.get(m.group()) or _escape(m.group()), text)


def printable(text: str) -> str:
    """Text for a terminal, as the CLI prints it: lines and tabs kept, every other control
    character escaped (so `\\x1b]2;…` shows as text instead of retitling the terminal)."""
    if text.isprintable() or not _PRINTED_CONTROL.search(text):
        return text
    return _PRINTED_CONTROL.sub(lambda m: _escape(m.group()), text)


def json_safe(text: str) -> str:
    """JSON text (whose encoder already escapes C0 inside strings) with DEL, C1 and the bidi
    controls written as `\\uNNNN` too: still valid JSON of the same value, and inert on a terminal.
    Outside strings JSON has only ASCII punctuation and whitespace, so every match is in a string."""
    return _PRINTED_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


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
