"""The structs messages are made of (a step's memory, its collectives per kind and per group, a
GPU's readings, a pipeline stage's spans, a digest's step brief, rank 0's hang reading). Those made
only of scalars are `gc=False` (see `messages`)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

from ringtop.protocol.fields import MAX_DIMENSION_CHARS, MAX_WORLD_SIZE, Count, RankIndex, Real, Seconds


class MemorySample(msgspec.Struct, kw_only=True, gc=False):
    """Bytes this rank holds. `*_bytes` of state are counted from the tensors the rank owns."""

    params_bytes: Count = 0
    grads_bytes: Count = 0
    optimizer_bytes: Count = 0
    rss_bytes: Count = 0
    cuda_allocated_bytes: Count = 0
    cuda_reserved_bytes: Count = 0
    cuda_peak_bytes: Count = 0
    cuda_peak_reserved_bytes: Count = 0
    cuda_alloc_retries: Count = 0
    """cudaMalloc retries after freeing cached blocks: a sign of memory pressure."""
    cuda_ooms: Count = 0


class CommStat(msgspec.Struct, kw_only=True, array_like=False, gc=False):
    """Collectives of one kind issued since the previous step. The one shape of a kind's totals
    from the agent's tracer to the UI's windows, which sum these over steps and ranks."""

    kind: str
    count: Count = 0
    bytes: Count = 0
    busy_ms: Real = 0.0
    group_size: Count = 0
    group: Annotated[str, msgspec.Meta(max_length=MAX_DIMENSION_CHARS)] = ""
    """The mesh dimension these calls ran on (`tp`, `dp`, `pp`) where the strategy's device mesh
    names a group smaller than the world; "" otherwise (a 1D run, the world group, an older agent).
    A step carries one entry per (kind, group)."""

    def add(self, other: CommStat) -> None:
        """Sum `other`'s calls into these totals (the kind and group size stay); a busy time
        that is not finite adds none."""
        self.count += other.count
        self.bytes += other.bytes
        if math.isfinite(other.busy_ms):
            self.busy_ms += other.busy_ms


class InFlight(msgspec.Struct, kw_only=True, gc=False):
    """A collective this rank has issued and not yet seen complete."""

    group: str
    """Its process group, named by its ranks (`world`, `0-3`, `0-6/2`, `1,5,9`: see metrics.hang)."""
    seq: Count
    """Its place among the collectives this rank issued on that group (1 = the first), the same on
    every rank that issues the same collectives in the same order."""
    kind: str
    bytes: Count = 0
    shapes: str = ""
    """A short digest of its tensors' shapes and dtypes: equal on ranks that issue the same call."""
    age_s: Real = 0.0


class GroupCursor(msgspec.Struct, kw_only=True, gc=False):
    """How far this rank has got on one process group."""

    group: str
    issued: Count = 0
    """Seq of the last collective issued on the group (0: none yet)."""
    completed: Count = 0
    """Seq of the last one seen complete."""
    count: Count = 0
    """In a Step: collectives issued on the group during that step."""
    digest: str = ""
    """In a Step: a digest of those collectives' kinds, sizes and shapes in issue order. Ranks that
    issued the same collectives agree on it; a rank that differs is out of step (a desync)."""


MAX_CALLS_PER_STEP = 256
"""A `calls` message lists a step's first 256 collectives and counts the rest in `dropped`."""


MAX_KIND_CHARS, MAX_GROUP_CHARS = 32, 256
"""A group named by a long list of ranks is cut to 256 characters, the last one `…`."""


class CollectiveCall(msgspec.Struct, array_like=True, gc=False):
    """One collective a rank issued in a step, as an array (a step may list hundreds). Times in ms
    from the step clock's begin; with `device`, `done_ms` and the wait are device times (CUDA
    events, from the step's first event on the compute stream), `issued_ms` the host's. The wait:
    the training thread (on GPU the compute stream) waiting for it (a blocking call, `Work.wait`,
    `wait_tensor`); None where nothing there did (DDP's reducer waits in C++). `done_ms` None: not
    complete by the time the step was reported."""

    kind: Annotated[str, msgspec.Meta(max_length=MAX_KIND_CHARS)]
    group: Annotated[str, msgspec.Meta(max_length=MAX_GROUP_CHARS)]
    seq: Count
    bytes: Count
    issued_ms: Real
    done_ms: Real | None = None
    wait_start_ms: Real | None = None
    wait_end_ms: Real | None = None
    device: bool = False


class GpuSample(msgspec.Struct, kw_only=True, gc=False):
    index: Count = 0
    name: str = ""
    util_percent: Real = 0.0
    mem_used_bytes: Count = 0
    mem_total_bytes: Count = 0
    power_w: Real = 0.0
    temperature_c: Real = 0.0
    pcie_tx_bytes_per_s: Real = 0.0
    pcie_rx_bytes_per_s: Real = 0.0
    pcie_generation: Count = 0
    pcie_width: Count = 0
    nvlink_tx_bytes_per_s: Real = 0.0
    """Summed over active NVLinks, from NVML's cumulative data counters."""
    nvlink_rx_bytes_per_s: Real = 0.0
    nvlink_links: Count = 0
    nvlink_version: Count = 0


class StageSpan(msgspec.Struct, array_like=True, gc=False):
    """One forward or backward of one micro-batch on one stage, in ms from the step window's start.
    Encoded as an array [micro_batch, op, start_ms, end_ms] to keep timelines small."""

    micro_batch: Count
    op: Literal["F", "B"]
    start_ms: Real
    end_ms: Real


class HangReport(msgspec.Struct, kw_only=True):
    """Rank 0's hang watch's reading (metrics/rules/hang.py), in an `Event` of kind `hang` or
    `desync`: typed, so a receiver gets it validated on entry instead of guarding a map's keys."""

    verdict: Literal["hang", "dead", "desync", "stall", "cleared"]
    """`cleared`: every rank steps again."""
    culprits: Annotated[list[RankIndex], msgspec.Meta(max_length=MAX_WORLD_SIZE)] = []
    waiting: Annotated[list[RankIndex], msgspec.Meta(max_length=MAX_WORLD_SIZE)] = []
    """The ranks waiting for the culprits (of a `desync` event: the ranks that agree)."""
    group: str = ""
    seq: Count = 0
    collective: str = ""
    wait_s: Real = 0.0
    step: Count = 0
    where: Annotated[dict[RankIndex, str], msgspec.Meta(max_length=MAX_WORLD_SIZE)] = {}
    """Per culprit, where it is (`in forward at model.py:57`), when it said."""
    lasted_s: Seconds = 0.0
    """Of `cleared`: how long the stall lasted."""


class StepBrief(msgspec.Struct, array_like=True, gc=False):
    """What a digest keeps of a step it does not carry whole (a newer one of the same rank came
    before the digest went out): what the step-time and loss histories, the cross-rank chart and
    goodput need of every step."""

    rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]
    step: Count
    ts: Real
    step_ms: Real
    loss: Real | None = None
    grad_norm: Real | None = None
    skipped: bool = False
