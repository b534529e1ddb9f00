"""Small, pure formatters for the UI: numbers, bytes, counts. No Textual here."""

from __future__ import annotations

import math
import time


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def count(n: float | None) -> str:
    """1234 -> '1.2k', 25_000_000 -> '25M', 7e9 -> '7.0B' (parameter counts, tokens/s)."""
    if not _finite(n):
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{sign}{v:.1f}{unit}" if v < 10 else f"{sign}{v:.0f}{unit}"
    return f"{sign}{n:.0f}"


def nbytes(n: float | None) -> str:
    """Bytes in binary units, compact: '512K', '48.0M', '31.2G'."""
    if not _finite(n) or n < 0:
        return "-"
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n:.0f}B"


def ms(x: float | None) -> str:
    if not _finite(x):
        return "-"
    if x >= 10_000:
        return f"{x:,.0f}"
    return f"{x:.1f}"


def num(x: float | None, digits: int = 1) -> str:
    if not _finite(x):
        return "-"
    return f"{x:,.{digits}f}"


def loss(x: float | None) -> str:
    if not _finite(x):
        return "-" if x is None else str(x)  # 'nan' / 'inf' is worth seeing
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.2f}"


def clock(ts: float) -> str:
    """Wall-clock seconds -> 'HH:MM:SS' local time."""
    if not _finite(ts) or ts <= 0:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(ts))


def ago(seconds: float) -> str:
    if not _finite(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
