"""Timing of tensor parallelism's collectives (DTensor's functional collectives) on 2 gloo ranks,
against a delay this script injects itself: before some steps rank 1 sleeps DELAY_S before its
forward, so rank 0's first all-reduce of that step cannot complete until DELAY_S after both left
the barrier, and rank 0 waits for it inside DTensor (`wait_tensor`).

`python tp_timing_worker.py DELAY_S OUT` on 2 ranks: each rank writes OUT/rank-R.json with, per
step, its kind ("plain", "late", "late-untimed": the same with the timing off), wall time,
exposed and busy ms and per-(kind, group) stats; rank 0 adds, per late step, the in-flight
collective a watcher thread saw in the ledger while rank 1 slept (none: an empty list).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ringtop.agent.instruments.comm_tracer import CommTracer
from ringtop.agent.models.data import batch_from
from ringtop.agent.models.factories import call_model
from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
from ringtop.strategies import collective_functional, collective_hooks, collective_naming, tensor_parallel
from ringtop.strategies.base import TrainSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_results  # noqa: E402

BATCH, SEQ, SIZE, SEED = 2, 16, "1m", 0
PLAN = ("plain", "plain", "plain", "plain", "late", "late-untimed")
"""The first step warms up (its times are not used)."""


class _NoPhases:
    def mark(self, phase: str) -> None:
        pass


def watch_ledger(tracer: CommTracer, min_age_s: float, stop: threading.Event, seen: list) -> None:
    """What the stall watch does: read the ledger from another thread (bounded poll, 5 ms)."""
    while not stop.wait(0.005):
        ops = [op for op in tracer.in_flight_ops() if op.age_s >= min_age_s]
        if ops:
            seen.append({"kind": ops[0].kind, "group": ops[0].group, "age_s": ops[0].age_s})
            return


def main() -> int:
    delay_s, out = float(sys.argv[1]), Path(sys.argv[2])
    rank, ctx = worker_results.gloo_rank()
    strategy = tensor_parallel.TensorParallelStrategy()
    strategy.setup(build_tiny_gpt(SIZE, SEED), lambda p: torch.optim.AdamW(p, lr=1e-3), ctx,
                   TrainSettings(batch_size=BATCH))
    tracer = CommTracer(dimension_of=collective_naming.dimension_of)
    steps, seen = [], {}
    for index, kind in enumerate(PLAN):
        collective_functional.TIME_FUNCTIONAL_WAITS = kind != "late-untimed"
        batch = batch_from(index * BATCH, BATCH, SEQ, MODEL_SIZES[SIZE].vocab_size, SEED)
        dist.barrier()  # both ranks start the step together (outside the traced step)
        stop, watcher = threading.Event(), None
        if rank == 0 and kind != "plain":
            seen[kind] = []
            watcher = threading.Thread(target=watch_ledger, args=(tracer, delay_s / 2, stop, seen[kind]), daemon=True)
            watcher.start()
        t0 = time.perf_counter()
        with collective_hooks.active(tracer):
            if rank == 1 and kind != "plain":
                late_until = time.perf_counter() + delay_s  # the injected lateness the test's bound comes from:
                while time.perf_counter() < late_until:  # a rank busy computing, not a wait for a state
                    pass
            strategy.run_step(batch, call_model, _NoPhases())
        step_ms = (time.perf_counter() - t0) * 1e3
        stop.set()
        if watcher is not None:
            watcher.join(5)
        summary = tracer.drain()
        steps.append({"kind": kind, "step_ms": step_ms, "exposed_comm_ms": summary.exposed_comm_ms,
                      "busy_ms": summary.busy_ms,
                      "in_flight_after": tracer.in_flight,
                      "comm": [{"kind": c.kind, "group": c.group, "count": c.count, "bytes": c.bytes,
                                "busy_ms": c.busy_ms} for c in summary.kinds]})
    return worker_results.finish(out, rank, {"steps": steps[1:], "seen_in_flight": seen})


if __name__ == "__main__":
    worker_results.run(main)
