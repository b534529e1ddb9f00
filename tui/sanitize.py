"""Wire text made safe for the UI: the one sanitizer, shared with the CLI (protocol/text_safety.py)."""

from __future__ import annotations

from ringtop.protocol.text_safety import sanitized, visible

__all__ = ["sanitized", "visible"]
