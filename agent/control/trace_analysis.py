"""Exposed communication from a Chrome trace written by `torch.profiler` (`export_chrome_trace`).

Pure and torch-free: JSON in, a small frozen dataclass out. Holistic Trace Analysis' definition:
exposed communication = communication time minus its overlap with computation, where each of the
two is the *union* of its intervals (so nested or concurrent events are never counted twice).

    analyze_trace(trace, *, timeline="auto") -> TraceAnalysis

`trace` is a path (`.json` or `.json.gz`), the parsed dict, or its `traceEvents` list. Only
complete events (`"ph": "X"`, `ts`/`dur` in microseconds) take part.

What the traces look like (torch 2.13, checked on 2-rank gloo DDP and on single collectives):

- CPU / gloo. The training thread holds `cat: "cpu_op"` events: `aten::*`, autograd's
  `autograd::engine::evaluate_function: ...` wrappers, DDP's `torch::distributed::reducer::mul_out`
  and `torch.distributed.ddp.reducer::copy_bucket_to_grad`, and the collective *issue* calls
  `c10d::allreduce_`, `c10d::_allgather_base_`, `c10d::_reduce_scatter_base_`, `c10d::broadcast_`,
  ... (the DDP ones nested inside an `AccumulateGrad` evaluate_function). The collective's
  execution is a `cat: "user_annotation"` span `gloo:all_reduce` / `gloo:all_gather` /
  `gloo:broadcast` / `gloo:reduce` / `gloo:barrier` / `gloo:all_to_all` on one of gloo's own
  `pt_gloo_runloop` threads (a blocking `gloo:send` appears on the calling thread); on gloo a
  `reduce_scatter_tensor` shows up as `gloo:all_reduce`. The time the training thread waits for a
  collective has no event of its own: it is a gap. `ProfilerStep#N`, `DistributedDataParallel.forward`,
  `Optimizer.step#...` are `user_annotation` spans on the training thread. No `record_param_comms`
  on CPU.
- GPU / NCCL. Collectives run as `cat: "kernel"` events named `ncclDevKernel_*` / `ncclKernel_*`
  on a CUDA stream, launched from the host inside `record_param_comms` (and `nccl:*`) spans;
  other kernels are compute; `gpu_memcpy` / `gpu_memset` are neither.

Hence two timelines (`timeline="auto"` picks "gpu" when the trace has any `kernel` event):

- "cpu": comm = `gloo:*` spans (any thread) united with the host spans of collectives
  (`c10d::*`, `record_param_comms`, `nccl:*`, `_c10d_functional::*`). compute = `cpu_op` events
  that are not communication, on every thread, minus the communication spans *of the same thread*:
  an autograd op that encloses a `c10d::allreduce_` counts as compute only outside that call.
  Annotations (`user_annotation`, `python_function`) are never compute: they cover waiting too.
- "gpu": comm = NCCL kernels (and `gloo:*` spans, if any CPU collective ran); compute = the other
  kernels. Host-side launch spans are left out: they are not device time.

Point-to-point transfers (`gloo:send` / `gloo:recv`, `c10d::send` / `c10d::recv_`, NCCL's
`SendRecv` kernels, `nccl:send` / `nccl:recv`) are not collective communication: on a pipeline a
stage's send or receive lasts until the other stage is ready for it, so its span is mostly waiting
for the other stage's compute — bubble, which the pipeline measures on its own. They are kept apart:
`p2p_ms` is their union and `p2p_wait_ms` the part of it with neither compute nor a collective
running (what a p2p-as-comm reading would have added to the exposed communication). Their spans are
still subtracted from the same thread's compute (a blocking send is waiting, not computing), and
their events are still counted per kind (`send`, `recv`, `send_recv`). (NCCL runs an all-to-all as
grouped sends and receives, so on the "gpu" timeline its kernels read as `send_recv` too; no ringtop
strategy issues all-to-all.)

Steps: with `ProfilerStep#N` spans, on the "cpu" timeline a step is its span's window (intervals
are cut at its edges: a gloo span that ends after the step's span does is counted up to the edge);
on the "gpu" timeline a kernel belongs to the step that launched it (the runtime call with the same
`correlation` starts inside the step's span), wherever it runs. A collective is counted in the step
where it starts (is launched). What lies outside every step is left out, and the totals are the
sums over the steps. Without steps, the whole trace
is one step (`step=None`). ringtop's `profile STEPS` marks each training step (`run_step`) as a
`ProfilerStep#N` span, so its data loading and control broadcast are outside. Collective counts
per kind come from the execution events (`gloo:*`,
NCCL kernels); only when a trace has none are the host spans counted (`record_param_comms` first,
else `c10d::*`, else `nccl:*`), so one collective is counted once.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringtop.metrics.timing import overlap_pct

Interval = tuple[float, float]

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_HOST_COMM_PREFIXES = ("c10d::", "nccl:", "_c10d_functional::", "c10d_functional::")
_STRIP_PREFIXES = ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "c10d_functional::",
                   "ncclDevKernel_", "ncclKernel_")
_KIND_PREFIXES = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
                  ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
                  ("send", "send"), ("recv", "recv"), ("barrier", "barrier"), ("reduce", "reduce"),
                  ("gather", "gather"), ("scatter", "scatter"), ("wait", "wait"))
_COMPUTE_CATS = ("cpu_op", "operator")
P2P_KINDS = frozenset({"send", "recv", "send_recv"})


# ---------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class StepAnalysis:
    """One profiled step (or the whole trace, `step=None`). Times in milliseconds."""

    step: int | None
    wall_ms: float
    comm_ms: float
    compute_ms: float
    exposed_comm_ms: float
    overlap_pct: float
    per_kind: tuple[tuple[str, int], ...] = ()
    p2p_ms: float = 0.0
    p2p_wait_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class TraceAnalysis:
    """Communication against computation in one rank's trace.

    comm_ms: union of collective communication intervals; compute_ms: union of computation
    intervals; exposed_comm_ms: comm_ms minus the part of it overlapped by computation (<= comm_ms);
    overlap_pct: 100 x (comm - exposed) / comm (0 when there is no communication);
    wall_ms: the steps' spans summed (or the trace's span); per_kind: (kind, events) pairs;
    p2p_ms: union of point-to-point intervals; p2p_wait_ms: the part of p2p_ms overlapped by
    neither compute nor a collective (on a pipeline: mostly waiting for the other stage).
    """

    comm_ms: float
    compute_ms: float
    exposed_comm_ms: float
    overlap_pct: float
    wall_ms: float
    steps: tuple[StepAnalysis, ...]
    per_kind: tuple[tuple[str, int], ...]
    timeline: str
    rank: int | None = None
    p2p_ms: float = 0.0
    p2p_wait_ms: float = 0.0

    def kind_counts(self) -> dict[str, int]:
        return dict(self.per_kind)


# ---------------------------------------------------------------- interval arithmetic


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of [start, end) intervals (empty ones dropped, touching ones joined)."""
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(merged: Sequence[Interval]) -> float:
    return sum(e - s for s, e in merged)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """a minus b, both merged."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


# ---------------------------------------------------------------- classification


def collective_kind(name: str, args: Mapping[str, Any] | None = None) -> str:
    """all_reduce, all_gather, reduce_scatter, broadcast, ... from an event's name (or, for
    `record_param_comms`, its "Collective name" argument); "other" when unrecognised."""
    if name == "record_param_comms" and args:
        name = str(args.get("Collective name", "other"))
    for prefix in _STRIP_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    norm = re.sub(r"[^a-z]", "", name.lower())
    for prefix, kind in _KIND_PREFIXES:
        if norm.startswith(prefix):
            return kind
    return "barrier" if "barrier" in norm else "other"


def _is_nccl_kernel(e: Mapping[str, Any]) -> bool:
    return e.get("_cat") == "kernel" and "nccl" in e["name"].lower()


def _is_exec_comm(e: Mapping[str, Any]) -> bool:
    """The collective's execution: a gloo span or an NCCL kernel."""
    return e["name"].startswith("gloo:") or _is_nccl_kernel(e)


def _is_host_comm(e: Mapping[str, Any]) -> bool:
    """The host side of a collective: its issue call or launch."""
    name = e["name"]
    return e.get("_cat") != "kernel" and (name == "record_param_comms" or name.startswith(_HOST_COMM_PREFIXES))


def _is_p2p(e: Mapping[str, Any]) -> bool:
    """A point-to-point transfer (send / recv), given that `e` is a communication event."""
    return collective_kind(e["name"], e.get("args")) in P2P_KINDS


# ---------------------------------------------------------------- loading


def load_trace(path: str | os.PathLike) -> dict:
    p = Path(path)
    raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    return json.loads(raw)


def _events(trace: Any) -> tuple[list[dict], int | None]:
    if isinstance(trace, (str, os.PathLike)):
        trace = load_trace(trace)
    rank = None
    if isinstance(trace, Mapping):
        info = trace.get("distributedInfo") or {}
        rank = info.get("rank") if isinstance(info, Mapping) else None
        trace = trace.get("traceEvents", [])
    out = []
    for e in trace:
        if not isinstance(e, Mapping) or e.get("ph") != "X" or not isinstance(e.get("name"), str):
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            continue
        ev = dict(e)
        ev["_cat"] = str(e.get("cat", "")).lower()
        ev["_start"], ev["_end"] = float(ts), float(ts) + float(dur)
        out.append(ev)
    return out, rank


# ---------------------------------------------------------------- analysis


def _counts(comm_events: list[dict]) -> Counter:
    exec_events = [e for e in comm_events if _is_exec_comm(e)]
    if not exec_events:
        host = [e for e in comm_events if _is_host_comm(e)]
        for pick in (lambda e: e["name"] == "record_param_comms", lambda e: e["name"].startswith("c10d::"),
                     lambda e: e["name"].startswith("nccl:")):
            exec_events = [e for e in host if pick(e)]
            if exec_events:
                break
    return Counter(collective_kind(e["name"], e.get("args")) for e in exec_events)


def _one(step: int | None, wall_us: float, comm: list[Interval], compute: list[Interval],
         comm_events: list[dict], p2p: Sequence[Interval] = ()) -> StepAnalysis:
    c, k, p = merge(comm), merge(compute), merge(p2p)
    comm_us = total(c)
    exposed_us = comm_us - total(intersect(c, k))
    p2p_wait_us = total(subtract(subtract(p, k), c))
    return StepAnalysis(step=step, wall_ms=wall_us / 1e3, comm_ms=comm_us / 1e3, compute_ms=total(k) / 1e3,
                        exposed_comm_ms=exposed_us / 1e3, overlap_pct=_overlap_pct(comm_us, exposed_us),
                        per_kind=tuple(sorted(_counts(comm_events).items())),
                        p2p_ms=total(p) / 1e3, p2p_wait_ms=p2p_wait_us / 1e3)


def _overlap_pct(comm: float, exposed: float) -> float:
    """0 rather than NaN without communication: the figure goes into a JSON reply."""
    return overlap_pct(comm, exposed) if comm > 0 else 0.0


def analyze_trace(trace: str | os.PathLike | Mapping | Sequence, *, timeline: str = "auto") -> TraceAnalysis:
    """Comm, compute and exposed comm of one rank's profiler trace (see the module docstring)."""
    if timeline not in ("auto", "cpu", "gpu"):
        raise ValueError(f"timeline must be auto, cpu or gpu, got {timeline!r}")
    events, rank = _events(trace)
    if timeline == "auto":
        timeline = "gpu" if any(e["_cat"] == "kernel" for e in events) else "cpu"
    comm, compute = _gpu_intervals(events) if timeline == "gpu" else _cpu_intervals(events)

    # point-to-point transfers apart from the collectives (see the module docstring)
    p2p = [c for c in comm if _is_p2p(c[2])]
    if p2p:
        comm = [c for c in comm if not _is_p2p(c[2])]

    steps = _step_spans(events)
    if steps:
        results = _per_step(steps, comm, p2p, compute, timeline)
    else:
        span = [e["_start"] for e in events] + [e["_end"] for e in events]
        wall = (max(span) - min(span)) if span else 0.0
        results = [_one(None, wall, [iv for _, iv, _ in comm], [iv for _, iv in compute],
                        [e for *_, e in comm + p2p], [iv for _, iv, _ in p2p])]

    comm_ms = sum(r.comm_ms for r in results)
    exposed_comm_ms = sum(r.exposed_comm_ms for r in results)
    kinds: Counter = Counter()
    for r in results:
        kinds.update(dict(r.per_kind))
    return TraceAnalysis(
        comm_ms=comm_ms, compute_ms=sum(r.compute_ms for r in results), exposed_comm_ms=exposed_comm_ms,
        overlap_pct=_overlap_pct(comm_ms, exposed_comm_ms), wall_ms=sum(r.wall_ms for r in results),
        steps=tuple(results), per_kind=tuple(sorted(kinds.items())), timeline=timeline,
        rank=rank if isinstance(rank, int) else None, p2p_ms=sum(r.p2p_ms for r in results),
        p2p_wait_ms=sum(r.p2p_wait_ms for r in results))


def _gpu_intervals(events: list[dict]) -> tuple[list[tuple[float, Interval, dict]], list[tuple[float, Interval]]]:
    """(anchor time for step assignment, interval) for comm and compute kernels; comm events kept
    for counts. A kernel's anchor is its launch on the host."""
    comm: list[tuple[float, Interval, dict]] = []
    compute: list[tuple[float, Interval]] = []
    launch_ts = {e["args"]["correlation"]: e["_start"] for e in events
                 if e["_cat"] in ("cuda_runtime", "runtime", "cuda_driver") and isinstance(e.get("args"), Mapping)
                 and "correlation" in e["args"]}
    for e in events:
        anchor = e["_start"]
        if e["_cat"] == "kernel":
            corr = (e.get("args") or {}).get("correlation")
            anchor = launch_ts.get(corr, anchor)
        if _is_exec_comm(e):
            comm.append((anchor, (e["_start"], e["_end"]), e))
        elif e["_cat"] == "kernel":
            compute.append((anchor, (e["_start"], e["_end"])))
    return comm, compute


def _cpu_intervals(events: list[dict]) -> tuple[list[tuple[float, Interval, dict]], list[tuple[float, Interval]]]:
    """As `_gpu_intervals`, on the host: a thread's compute is its ops less its own comm."""
    comm: list[tuple[float, Interval, dict]] = []
    compute: list[tuple[float, Interval]] = []
    comm_by_thread: dict[tuple, list[Interval]] = defaultdict(list)
    ops_by_thread: dict[tuple, list[Interval]] = defaultdict(list)
    for e in events:
        thread = (e.get("pid"), e.get("tid"))
        if _is_exec_comm(e) or _is_host_comm(e):  # collectives and p2p: both are waiting, not compute
            comm.append((e["_start"], (e["_start"], e["_end"]), e))
            comm_by_thread[thread].append((e["_start"], e["_end"]))
        elif e["_cat"] in _COMPUTE_CATS and not _STEP_RE.match(e["name"]):
            ops_by_thread[thread].append((e["_start"], e["_end"]))
    for thread, ops in ops_by_thread.items():
        for iv in subtract(merge(ops), merge(comm_by_thread.get(thread, []))):
            compute.append((iv[0], iv))
    return comm, compute


def _step_spans(events: list[dict]) -> list[tuple[int, float, float]]:
    """(number, start, end) of the host's step spans, in time order (kineto also mirrors them on
    the GPU timeline as gpu_user_annotation)."""
    by_number: dict[int, tuple[int, float, float]] = {}
    for e in events:
        if e["_cat"] != "gpu_user_annotation" and (m := _STEP_RE.match(e["name"])):
            by_number.setdefault(int(m.group(1)), (int(m.group(1)), e["_start"], e["_end"]))
    return sorted(by_number.values(), key=lambda t: t[1])


def _per_step(steps: list[tuple[int, float, float]], comm: list, p2p: list, compute: list,
              timeline: str) -> list[StepAnalysis]:
    starts = [s for _, s, _ in steps]

    def which(t: float) -> int | None:
        lo, hi = 0, len(steps) - 1
        idx = None
        while lo <= hi:  # last step starting at or before t
            mid = (lo + hi) // 2
            if starts[mid] <= t:
                idx, lo = mid, mid + 1
            else:
                hi = mid - 1
        return idx if idx is not None and t < steps[idx][2] else None

    per_comm: dict[int, list] = defaultdict(list)
    per_p2p: dict[int, list] = defaultdict(list)
    per_compute: dict[int, list] = defaultdict(list)
    for items, per in ((comm, per_comm), (p2p, per_p2p)):
        for anchor, iv, e in items:
            if (i := which(anchor)) is not None:
                per[i].append((iv, e))
    for anchor, iv in compute:
        if (i := which(anchor)) is not None:
            per_compute[i].append(iv)
    all_comm, all_compute = merge(iv for _, iv, _ in comm), merge(iv for _, iv in compute)
    all_p2p = merge(iv for _, iv, _ in p2p)
    results: list[StepAnalysis] = []
    for i, (num, s, e) in enumerate(steps):
        if timeline == "cpu":  # the step's window: a collective's tail past it is not this step's
            window = [(s, e)]
            comm_iv, compute_iv = intersect(all_comm, window), intersect(all_compute, window)
            p2p_iv = intersect(all_p2p, window)
        else:  # kernels run after their launch: they belong to the step that launched them
            comm_iv, compute_iv = [iv for iv, _ in per_comm[i]], per_compute[i]
            p2p_iv = [iv for iv, _ in per_p2p[i]]
        results.append(_one(num, e - s, comm_iv, compute_iv, [ev for _, ev in per_comm[i] + per_p2p[i]], p2p_iv))
    return results
