"""`import ringtop`: the public API for watching a training script of your own. Light on import:
torch and the agent load only when `ringtop.Monitor` is first used."""

from __future__ import annotations

from typing import Any

__all__ = ["Monitor"]


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from ringtop.agent.loop.monitor import Monitor

        return Monitor
    raise AttributeError(f"module 'ringtop' has no attribute {name!r}")
