"""The per-rank worker of `ringtop bench comm`: an nccl-tests-style sweep of collectives.

Run under torch's elastic launcher (`ringtop bench comm` does that; see `cli/bench.py`):

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m ringtop.agent.instruments.bench_comm \
        --ops all_reduce,all_gather --sizes 1024,2048,4096 --iters 20 --warmup 5 --out result.json

Every rank runs the same sweep; rank 0 writes the result as JSON (the shape is documented in
`ringtop.cli.bench`). Per op and size, as nccl-tests does (out-of-place, float32):

- a barrier, `warmup` untimed calls, a barrier, then `iters` calls back to back, timed with
  `time.perf_counter` around the whole loop (on CUDA, one device synchronisation after the loop,
  none between the calls); time = loop time / iters, each rank's mean;
- the reported time is the max over ranks of those means (one all-reduce MAX after the whole
  sweep, so the reduction never disturbs a timed loop);
- size and count as nccl-tests prints them: all_reduce and broadcast: the tensor; all_gather: the
  gathered output (count = each rank's input); reduce_scatter: the full input (count = each rank's
  output). The per-rank count is whole elements, so size is rounded down to a multiple of 4 x N.
- algbw = size / time, busbw = algbw x nccl-tests' factor (`metrics.busbw`).

Collectives: `all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`, `broadcast` from
rank 0. On gloo, `reduce_scatter_tensor` runs as an all-reduce of the full input (see
shared/notes/cpu-distributed-facts.md), so its busbw there is half a true reduce-scatter's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

from ringtop.metrics.costs.busbw import algbw_gbps, busbw_gbps
from ringtop.protocol import safe_files

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
ELEMENT_BYTES = 4  # float32
DEFAULT_TIMEOUT_S = 300.0


def counts_for(op: str, size_bytes: int, world_size: int) -> tuple[int, int]:
    """(nccl-tests "count", the reported size in bytes) for a requested size.

    all_reduce / broadcast: the tensor's elements; all_gather / reduce_scatter: each rank's shard
    (the gathered output or the scattered input is count x N elements)."""
    elements = size_bytes // ELEMENT_BYTES
    if op in ("all_gather", "reduce_scatter"):
        per_rank = elements // world_size
        return per_rank, per_rank * world_size * ELEMENT_BYTES
    return elements, elements * ELEMENT_BYTES


def make_call(op: str, count: int, world_size: int, device: torch.device):
    """The collective, with its buffers allocated once (out-of-place where the op has an output)."""
    if op == "all_reduce":
        buf = torch.ones(count, dtype=torch.float32, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        inp = torch.ones(count, dtype=torch.float32, device=device)
        out = torch.empty(count * world_size, dtype=torch.float32, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        inp = torch.ones(count * world_size, dtype=torch.float32, device=device)
        out = torch.empty(count, dtype=torch.float32, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "broadcast":
        buf = torch.ones(count, dtype=torch.float32, device=device)
        return lambda: dist.broadcast(buf, src=0)
    raise ValueError(f"unknown op {op!r}: use one of {', '.join(OPS)}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loop(call, iters: int, warmup: int, device: torch.device) -> float:
    """Mean seconds per call on this rank: warm-up, barrier, `iters` calls back to back."""
    dist.barrier()
    for _ in range(warmup):
        call()
    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    return (time.perf_counter() - t0) / iters


def iters_for(size_bytes: int, iters: int, warmup: int, large_bytes: int, large_iters: int) -> tuple[int, int]:
    """Sizes above `large_bytes` run at most `large_iters` timed calls and one warm-up (CPU budgets)."""
    if large_bytes > 0 and size_bytes > large_bytes:
        return max(1, min(iters, large_iters)), min(warmup, 1)
    return iters, warmup


def run_sweep(ops: list[str], sizes: list[int], iters: int, warmup: int, device: torch.device,
              large_bytes: int = 0, large_iters: int = 2, progress: bool = False) -> dict:
    """The whole sweep on this rank; every rank gets the same result (times are max over ranks)."""
    world = dist.get_world_size()
    rows: list[tuple[str, int, int, int, float]] = []  # op, count, size, iters, local mean seconds
    for op in ops:
        t_op = time.perf_counter()
        for size in sizes:
            count, nbytes = counts_for(op, size, world)
            if count < 1:
                continue
            n_iters, n_warm = iters_for(nbytes, iters, warmup, large_bytes, large_iters)
            call = make_call(op, count, world, device)
            rows.append((op, count, nbytes, n_iters, time_loop(call, n_iters, n_warm, device)))
            del call
        if progress and dist.get_rank() == 0:
            print(f"# {op}: {len(sizes)} sizes in {time.perf_counter() - t_op:.1f} s", file=sys.stderr, flush=True)
    local = torch.tensor([r[4] for r in rows], dtype=torch.float64, device=device)
    if len(rows):
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
    times = local.cpu().tolist()
    out_ops: dict[str, list[dict]] = {op: [] for op in ops}
    for (op, count, nbytes, n_iters, _), seconds in zip(rows, times):
        out_ops[op].append({
            "size_bytes": nbytes, "count": count, "time_us": seconds * 1e6, "iters": n_iters,
            "algbw_gbps": algbw_gbps(nbytes, seconds), "busbw_gbps": busbw_gbps(op, nbytes, seconds, world),
        })
    return {
        "backend": dist.get_backend(), "world_size": world, "device": device.type, "dtype": "float32",
        "ops": out_ops,
        "peak_busbw_gbps": {op: max((r["busbw_gbps"] for r in rs), default=0.0) for op, rs in out_ops.items()},
    }


def _pick_backend(choice: str) -> tuple[str, torch.device]:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if choice == "auto":
        choice = "nccl" if torch.cuda.is_available() else "gloo"
    if choice == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit("ringtop bench comm: --backend nccl needs a CUDA device, and torch sees none")
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ringtop.agent.instruments.bench_comm",
                                description="Per-rank worker of `ringtop bench comm` (run under torchrun).")
    p.add_argument("--ops", required=True, help="comma-separated: " + ",".join(OPS))
    p.add_argument("--sizes", default=None, help="comma-separated sizes in bytes")
    p.add_argument("--min-bytes", type=int, default=None, help="with --max-bytes instead of --sizes: doubling sweep")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest size (default: 256 MiB on nccl, 64 MiB on gloo, never below --min-bytes)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--large-bytes", type=int, default=None,
                   help="sizes above this run at most --large-iters timed calls and one warm-up "
                        "(0: off; default 16 MiB on gloo, off on nccl)")
    p.add_argument("--large-iters", type=int, default=2)
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--out", required=True, help="rank 0 writes the JSON result here")
    p.add_argument("--progress", action="store_true", help="rank 0 prints a line per op to stderr")
    return p


DEFAULT_MAX_BYTES = {"nccl": 256 << 20, "gloo": 64 << 20}
DEFAULT_LARGE_BYTES = {"nccl": 0, "gloo": 16 << 20}


def doubling_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    return sizes


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor etc. are "deprecated"
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise SystemExit(f"unknown op(s) {', '.join(bad)}: use {', '.join(OPS)}")
    backend, device = _pick_backend(args.backend)
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    else:
        lo = args.min_bytes if args.min_bytes is not None else 1024
        hi = args.max_bytes if args.max_bytes is not None else max(lo, DEFAULT_MAX_BYTES[backend])
        sizes = doubling_sizes(lo, hi)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout_s))
    try:
        large = args.large_bytes if args.large_bytes is not None else DEFAULT_LARGE_BYTES[backend]
        result = run_sweep(ops, sizes, args.iters, args.warmup, device, large, args.large_iters,
                           progress=args.progress)
        result["iters"], result["warmup"] = args.iters, args.warmup
        if dist.get_rank() == 0:
            safe_files.write_output(args.out, json.dumps(result, indent=1).encode())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from ringtop.agent.distributed import exit_rank

    exit_rank(main())
