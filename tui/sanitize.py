"""Wire text made safe for the terminal: no control character reaches it raw.

Every string a message carries (a host, an event's text, a command id, keys and values of free-form
maps) passes through here once, as the message enters the UI; control characters (C0, DEL, C1:
escape sequences, bell, carriage return) are shown as visible `\\xNN` escapes. Newlines and tabs
become spaces: each message is drawn on one line. Markup is not a concern here: the UI draws wire
text only as `rich.text.Text`, which never parses it."""

from __future__ import annotations

import re
from typing import Any

import msgspec

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPACES = {"\n": " ", "\t": " "}


def visible(text: str) -> str:
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: _SPACES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def sanitized(msg: Any) -> Any:
    """`msg` with every string in it made visible (the same object when there was nothing to do)."""
    changes = {}
    for name in msg.__struct_fields__:
        value = getattr(msg, name)
        clean = _clean(value)
        if clean is not value:
            changes[name] = clean
    return msgspec.structs.replace(msg, **changes) if changes else msg


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        clean = visible(value)
        return value if clean == value else clean
    if isinstance(value, msgspec.Struct):
        return sanitized(value)
    if isinstance(value, list):
        items = [_clean(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, dict):
        items = {(_clean(k) if isinstance(k, str) else k): _clean(v) for k, v in value.items()}
        same = all(a is b for a, b in zip(items, value)) and all(items[k] is value[k] for k in value if k in items)
        return value if same and len(items) == len(value) else items
    return value
