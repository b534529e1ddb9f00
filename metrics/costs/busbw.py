"""Algorithm and bus bandwidth of collectives, as nccl-tests defines them (its doc/PERFORMANCE.md):
algbw = size / time, busbw = algbw x a factor per collective that makes busbw comparable to the
link's peak whatever the collective and the number of ranks. GB = 1e9 bytes."""

from __future__ import annotations

import math

from ringtop.metrics.units import GB

BUSBW_FACTOR_TEXT: dict[str, str] = {
    "all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n", "all_to_all": "(n-1)/n",
    "broadcast": "1", "reduce": "1"}
"""The factor of each collective kind that has one, as a formula in n (the group size)."""
BUSBW_FACTOR_KINDS: tuple[str, ...] = tuple(BUSBW_FACTOR_TEXT)


def busbw_factor(kind: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter,
    all_to_all (n-1)/n; broadcast, reduce 1. busbw = algbw x factor is comparable to the link peak."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    if kind in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective kind {kind!r}: use one of {', '.join(BUSBW_FACTOR_KINDS)}")


def busbw_factor_or_nan(kind: str, ranks: int) -> float:
    """busbw_factor, or NaN where there is none (point-to-point, barrier, group size unknown): the
    UI shows such a kind's bytes without a bus bandwidth instead of failing."""
    if ranks < 1:
        return math.nan
    try:
        return busbw_factor(kind, ranks)
    except ValueError:
        return math.nan


def algbw_gbps(payload_bytes: int | float, seconds: float) -> float:
    """Algorithm bandwidth: payload ("size" in nccl-tests) / time, in GB/s."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return float(payload_bytes) / seconds / GB


def busbw_gbps(kind: str, payload_bytes: int | float, seconds: float, ranks: int) -> float:
    """Bus bandwidth: algbw x busbw_factor(kind, ranks), in GB/s."""
    return algbw_gbps(payload_bytes, seconds) * busbw_factor(kind, ranks)


def rate_gbps(nbytes: float, busy_ms: float) -> float:
    """algbw over a measured busy time in ms, NaN when nothing was timed (busy_ms not > 0) or the
    bytes are not finite: a window of telemetry may hold either."""
    if not (busy_ms > 0 and math.isfinite(nbytes)):
        return math.nan
    return algbw_gbps(nbytes, busy_ms / 1e3)
