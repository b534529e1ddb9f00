"""Every number format ringtop prints, UI and CLI alike: pure functions to `str`, "-" for a number
that is missing or not finite. No Textual, no Rich (the CLI and the agent import this)."""

from __future__ import annotations

import math
import time

from ringtop.metrics.units import MIB


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
    """Bytes in binary units, compact, at most 7 characters: '512B', '512KiB', '48.0MiB', '31.2GiB'."""
    if not _finite(n) or n < 0:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
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


def tflops(x: float | None) -> str:
    """Three significant figures, whole numbers from 100 (`0.129`, `12.3`, `989`); `-` for 0: not known."""
    if not _finite(x) or x <= 0:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


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


def pct(x_pct: float) -> str:
    """A percentage without its sign: 0 decimals from 10, else 1 (`54`, `5.3`)."""
    if not _finite(x_pct):
        return "-"
    return f"{x_pct:.0f}" if x_pct >= 10 else f"{x_pct:.1f}"


def fraction_pct(fraction: float, digits: int = 1) -> str:
    """A fraction as a percentage with its sign: 0.273 -> `27.3%`."""
    return f"{100 * fraction:.{digits}f}%" if _finite(fraction) else "-"


def signed_fraction_pct(fraction: float) -> str:
    """A difference of fractions as signed points, with a true minus: -0.012 -> `−1.2%`."""
    if not _finite(fraction):
        return "-"
    return f"{100 * fraction:+.1f}%".replace("-", "−")


def delta_pct(x_pct: float) -> str:
    """A signed deviation in percent, more decimals the closer to 0: `+0.12%`, `-4.5%`, `+120%`."""
    if not _finite(x_pct):
        return "-"
    if abs(x_pct) < 1:
        return f"{x_pct:+.2f}%"
    if abs(x_pct) < 100:
        return f"{x_pct:+.1f}%"
    return f"{x_pct:+.0f}%"


def per_step(x: float) -> str:
    """A count per step: whole numbers plain, means with two decimals."""
    if not _finite(x):
        return "-"
    return f"{x:,.0f}" if abs(x - round(x)) < 0.005 else f"{x:,.2f}"


def gbps(x: float) -> str:
    """GB/s with three significant digits: 0.00137, 0.0137, 0.137, 1.37, 13.7, 137."""
    if not _finite(x):
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    for digits, floor in ((2, 1.0), (3, 0.1), (4, 0.01), (5, 0.001)):
        if x >= floor:
            return f"{x:.{digits}f}"
    return "0" if x == 0 else f"{x:.1e}"


def mib(n_bytes: float | None) -> str:
    """Bytes as binary MiB without the unit, for a column that names it: 4.22, 42.2, 422, 4,222."""
    if not _finite(n_bytes):
        return "-"
    x = n_bytes / MIB
    if x == 0:
        return "0"
    if x < 10:
        return f"{x:.2f}"
    if x < 100:
        return f"{x:.1f}"
    return f"{x:,.0f}"


def mb_compact(mb_s: float) -> str:
    """MB/s in at most 4 characters: 0 (under 0.005), 0.05, 12.5, 1234, 12k."""
    if not _finite(mb_s):
        return "-"
    if mb_s < 0.005:
        return "0"
    if mb_s < 10:
        return f"{mb_s:.2f}" if mb_s < 1 else f"{mb_s:.1f}"
    if mb_s < 100:
        return f"{mb_s:.1f}"
    if mb_s < 10_000:
        return f"{mb_s:.0f}"
    return f"{mb_s / 1000:.0f}k"


def seconds(s: float) -> str:
    """Seconds with three significant digits, a plain 0 for none."""
    return "0" if s == 0 else f"{s:.3g}"


def us(x: float) -> str:
    """Microseconds: two decimals below 100, one from there."""
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"
