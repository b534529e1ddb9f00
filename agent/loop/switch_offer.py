"""What this run can switch to, told once in its Hello, so that the UI offers only that (a switch
to ZeRO without DeepSpeed, or in an own loop, was refused only after it was sent)."""

from __future__ import annotations

import importlib.util

DEEPSPEED_STRATEGIES = ("zero1", "zero2", "zero3")
EVERY_TARGET = "*"


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
        return {name: "DeepSpeed is not installed: pip install 'ringtop[deepspeed]'" for name in DEEPSPEED_STRATEGIES}
    return {}
