"""What this run can switch to, told once in its Hello, so that the UI offers only that (a switch
to ZeRO without DeepSpeed, or in an own loop, was refused only after it was sent)."""

from __future__ import annotations

import importlib.util

from ringtop.metrics.install_hint import install_command

DEEPSPEED_STRATEGIES = ("zero1", "zero2", "zero3")
EVERY_TARGET = "*"
REASON_MAX_CHARS = 400
"""Hello.switch_unavailable's longest reason (protocol/messages.py)."""


def deepspeed_missing() -> bool:
    """Without importing it (seconds when it is there): a failed import still refuses the switch."""
    try:
        return importlib.util.find_spec("deepspeed") is None
    except (ImportError, ValueError):
        return True


def switch_unavailable(*, own_loop: bool = False, own_loop_reason: str = "") -> dict[str, str]:
    """Hello.switch_unavailable: the `switch` strategies this run cannot take, each with why."""
    if own_loop:
        return {EVERY_TARGET: own_loop_reason or "this run's own loop cannot switch its strategy"}
    if deepspeed_missing():
        reason = deepspeed_missing_reason()
        return {name: reason for name in DEEPSPEED_STRATEGIES}
    return {}


def deepspeed_missing_reason() -> str:
    """The install line for this ringtop as it was installed (a source checkout: `pip install -e
    ".[deepspeed]"`); a checkout's path too long for the Hello's field leaves the line out, since a
    reason past REASON_MAX_CHARS would make the whole Hello undecodable."""
    reason = f"DeepSpeed is not installed: {install_command('deepspeed')}"
    return reason if len(reason) <= REASON_MAX_CHARS else "DeepSpeed is not installed: add ringtop's deepspeed extra"
