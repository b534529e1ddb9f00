"""`ringtop trace` on generated logs: 8 ranks x 1,000 steps (2 hosts) and 1,024 ranks x 50 steps
(128 hosts, as `ringtop simulate --ranks 1024 --nodes 128` spreads them; simulate publishes and
writes no logs, so the Step messages are made here with protocol's encoder, as the agent writes
them: phases, two collective kinds, a group cursor, memory, and the log-only `calls` line with each
of the step's five collectives, its issue, completion and wait). Per arm: the real CLI in its own
process (wall time, peak RSS from wait4), the Python heap's peak (tracemalloc, in this
process), the log and output sizes, and the growth per step and
rank. Prints one JSON object.

    python benchmarks/bench_trace.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ringtop.protocol import (
    CollectiveCall,
    CollectiveCalls,
    CommStat,
    Event,
    GroupCursor,
    Hello,
    MemorySample,
    Step,
    to_json_line,
)


def write_logs(folder: Path, ranks: int, steps: int, hosts: int, seed: int = 0) -> int:
    """A run's rank-R.jsonl files; returns their bytes."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    per_host = max(ranks // hosts, 1)
    total = 0
    for rank in range(ranks):
        host = f"node-{rank // per_host:03d}"
        skew_s = (rank // per_host) * 0.0004  # each host's clock a little off
        t = 1_800_000_000.0 + skew_s
        lines = [to_json_line(Hello(rank=rank, seq=0, ts=t, run_id="bench", world_size=ranks, host=host))]
        for s in range(1, steps + 1):
            data, fwd, bwd, opt = (rng.uniform(0.2, 0.4), rng.uniform(20, 24), rng.uniform(40, 46),
                                   rng.uniform(5, 6))
            step_ms = data + fwd + bwd + opt + rng.uniform(0.3, 0.6)
            t += step_ms / 1e3
            lines.append(to_json_line(Step(
                rank=rank, seq=s, ts=t, step=s, loss=2.0 / s ** 0.1, step_ms=step_ms, grad_norm=1.0,
                data_ms=data, forward_ms=fwd, backward_ms=bwd, optimizer_ms=opt, exposed_comm_ms=3.0,
                comm_busy_ms=30.0, tokens=4096, tokens_per_s=4096 / step_ms * 1e3,
                mem=MemorySample(params_bytes=100_000_000, grads_bytes=100_000_000, optimizer_bytes=200_000_000),
                comm=[CommStat(kind="all_reduce", count=4, bytes=400_000_000, busy_ms=28.0, group_size=ranks),
                      CommStat(kind="broadcast", count=1, bytes=8, busy_ms=0.1, group_size=ranks)],
                collectives=[GroupCursor(group="world", issued=5 * s, completed=5 * s, count=5)])))
            calls = step_calls(s, data, fwd, bwd)
            lines.append(to_json_line(CollectiveCalls(rank=rank, seq=s, ts=t, step=s, calls=calls)))
            if rank == 0 and s % 100 == 0:
                lines.append(to_json_line(Event(rank=0, seq=s, ts=t, kind="checkpoint", step=s,
                                                text=f"full checkpoint of step {s}")))
        data = b"".join(lines)
        (folder / f"rank-{rank}.jsonl").write_bytes(data)
        total += len(data)
    return total


def step_calls(step: int, data_ms: float, forward_ms: float, backward_ms: float) -> list[CollectiveCall]:
    """Four gradient buckets all-reduced during backward (the last one waited for at its end) and
    the loss's broadcast, as a DDP step lists them."""
    start = data_ms + forward_ms
    calls = []
    for b in range(4):
        issued = start + backward_ms * (b + 1) / 5
        done = issued + 7.0
        waited = b == 3
        calls.append(CollectiveCall(kind="all_reduce", group="world", seq=5 * (step - 1) + b + 1, bytes=100_000_000,
                                    issued_ms=issued, done_ms=done, wait_start_ms=done - 3.0 if waited else None,
                                    wait_end_ms=done if waited else None))
    end = start + backward_ms + 7.0
    calls.append(CollectiveCall(kind="broadcast", group="world", seq=5 * step, bytes=8, issued_ms=end,
                                done_ms=end + 0.1, wait_start_ms=end, wait_end_ms=end + 0.1))
    return calls


def trace_once(folder: Path, out: Path) -> tuple[float, int]:
    """(wall s, peak RSS bytes) of one `ringtop trace` in its own process."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ringtop.cli.main", "trace", str(folder), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"trace failed: {proc.stderr.read().decode()[-2000:]}")
    return wall_s, usage.ru_maxrss * 1024


def python_heap_peak(folder: Path, out: Path) -> int:
    """Peak bytes the Python heap held while tracing (tracemalloc): what grows with the log if
    anything is held, apart from the interpreter's and the allocator's own."""
    import tracemalloc

    from ringtop.cli.trace import StepWindow, write_trace

    tracemalloc.start()
    with open(out, "w", encoding="utf-8") as f:
        write_trace(folder, f, StepWindow())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    arms = [("8 ranks x 1000 steps", 8, 1000, 2), ("1024 ranks x 50 steps", 1024, 50, 128)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks, steps, hosts in arms:
            folder = Path(tmp) / f"r{ranks}"
            log_bytes = write_logs(folder, ranks, steps, hosts)
            out = folder / "trace.json"
            walls, rss = [], 0
            for _ in range(args.rounds):
                wall_s, peak = trace_once(folder, out)
                walls.append(wall_s)
                rss = max(rss, peak)
                print(f"{name}: {wall_s:.2f} s", file=sys.stderr)
            heap_peak = python_heap_peak(folder, out)
            out_bytes = out.stat().st_size
            events = len(json.loads(out.read_text())["traceEvents"])
            walls.sort()
            cells = ranks * steps
            results.append({"arm": name, "ranks": ranks, "steps": steps, "hosts": hosts, "log_bytes": log_bytes,
                            "trace_bytes": out_bytes, "events": events, "wall_s_median": walls[len(walls) // 2],
                            "wall_s_all": walls, "peak_rss_bytes": rss,
                            "python_heap_peak_bytes": heap_peak,
                            "us_per_rank_step": walls[len(walls) // 2] / cells * 1e6,
                            "trace_bytes_per_rank_step": out_bytes / cells,
                            "log_bytes_per_rank_step": log_bytes / cells})
    print(json.dumps({"benchmark": "bench_trace", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                      "load_average": os.getloadavg(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
