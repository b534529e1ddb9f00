"""Checkpoint save throughput against a raw write of the same bytes, and the training stall of an
async save against a synchronous one, in one live run.

One run (2 gloo ranks on CPU, ddp, the 125m tiny-gpt by default, batch 1 x seq 64) trains until
stopped; each round, in alternating order, it is sent:

- `checkpoint {"kind": "full"}` and `{"kind": "sharded"}` (synchronous). Throughput = the done
  reply's bytes / seconds (and bytes / the wall time from sending to the done reply, which adds the
  wait for the step boundary).
- a raw write of the same number of bytes into the same checkpoint directory: os.write of an 8 MB
  buffer until that many bytes, then fsync, timed from the first write to the end of the fsync.
  The ranks are paused (SIGSTOP, then SIGCONT) during it, as training is paused during a
  synchronous save, so the raw write does not share the 2 cores with training either.
  Target: checkpoint throughput >= 0.7 x raw.
- `checkpoint {"kind": ..., "async": true}`.

The stall comes from rank 0's step records: with the save issued at the boundary after step k,
the interval ts[k+1] - ts[k] holds it. Baseline = the median interval away from any save or pause.
`boundary stall` = that one interval minus the baseline; `total stall` = the sum, over the
intervals from step k to the step m after which the done reply came (a background save is polled
and published there), of interval minus baseline: the training time lost to the save in all. For
the async saves it also gives the time the training thread spent staging (the save call before
the writer thread starts) and how much slower the steps that ran beside the writer were (their
step_ms over the median step_ms), from the phase timers of benchmarks/_timed_agent.py.

    python benchmarks/bench_checkpoint.py [--rounds 2] [--model-size 125m]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import AgentRun, command, kill, median, phase_sums, start_agents, stop

from ringtop.cli.launch import descendants

NPROC = 2
CHUNK = 8 * 1024 * 1024
WARMUP_STEP = 4
GAP_STEPS = 3
KINDS = ("full", "sharded")


def raw_write(directory: Path, nbytes: int, buf: bytes) -> float:
    """Seconds to os.write `nbytes` in CHUNK-sized writes and fsync them, in `directory`."""
    path = directory / f".raw-write-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(buf)
    try:
        t0 = time.perf_counter()
        remaining = nbytes
        while remaining > 0:
            remaining -= os.write(fd, view[:min(CHUNK, remaining)])
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return seconds


def paused(run: AgentRun, pause: bool):
    """Context: the ranks (the launcher's descendants) stopped with SIGSTOP, resumed on exit."""
    class _Pause:
        def __enter__(self):
            self.pids = descendants(run.proc.pid) if pause else []
            self.t0 = time.time()
            for pid in self.pids:
                os.kill(pid, signal.SIGSTOP)
            return self

        def __exit__(self, *exc):
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.t1 = time.time()
            return False
    return _Pause()


def step_ts(run: AgentRun, rank: int = 0) -> dict[int, float]:
    return {s.step: s.ts for s in run.steps(rank)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-size", default="125m")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--no-pause", action="store_true", help="do not pause the ranks during the raw write")
    parser.add_argument("--workdir", default=None, help="where the run and its checkpoints go (default: a temp dir)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    buf = os.urandom(CHUNK)
    started = time.time()
    saves: list[dict] = []   # one per checkpoint command
    raws: list[dict] = []
    pauses: list[tuple[float, float]] = []
    bytes_of: dict[str, int] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        run = start_agents(Path(tmp) / "run", NPROC, "--steps", "0", "--model-size", args.model_size,
                           "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--keep", "2")
        try:
            run.wait_for_step(WARMUP_STEP)

            def gap() -> None:
                run.wait_for_step(run.last_step() + GAP_STEPS)

            def save(kind: str, background: bool) -> None:
                t = time.time()
                r = command(run, "checkpoint", {"kind": kind, "async": background})
                bytes_of[kind] = r.result["bytes"]
                phases = [phase_sums(run.phases(rank, since=t)) for rank in range(NPROC)]
                saves.append({"kind": kind, "async": background, "step": r.result["step"], "bytes": r.result["bytes"],
                              "reply_seconds": r.result["seconds"], "wall_seconds": r.done_s, "sent_at": t,
                              "done_at": t + r.done_s, "phases_rank0": phases[0], "phases_rank1": phases[1],
                              # on the training thread: the whole save (sync) or the staging (async)
                              "training_thread_s": max(p.get("ckpt.save", float("nan")) for p in phases)})
                print(f"  {kind} {'async' if background else 'sync'}: {r.result['bytes'] / 1e6:.0f} MB in "
                      f"{r.result['seconds']:.2f} s (wall {r.done_s:.2f} s)", file=sys.stderr, flush=True)
                gap()

            def raw(kind: str) -> None:
                with paused(run, not args.no_pause) as p:
                    seconds = raw_write(run.checkpoint_dir, bytes_of[kind], buf)
                pauses.append((p.t0, p.t1))
                raws.append({"kind": kind, "bytes": bytes_of[kind], "seconds": seconds})
                print(f"  raw {kind}: {bytes_of[kind] / 1e6:.0f} MB in {seconds:.2f} s", file=sys.stderr, flush=True)
                gap()

            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
                kinds = KINDS if r % 2 == 0 else KINDS[::-1]
                for kind in kinds:
                    steps = [lambda k=kind: save(k, False), lambda k=kind: raw(k)]
                    if r % 2 and kind in bytes_of:
                        steps.reverse()
                    for s in steps:
                        s()
                for kind in kinds[::-1]:
                    save(kind, True)
            ts0 = step_ts(run, 0)
            step_ms0 = {st.step: st.step_ms for st in run.steps(0)}
            stop(run)
        finally:
            kill(run)

    # ---- stalls from rank 0's step records
    steps = sorted(ts0)
    interval = {s: (ts0[s + 1] - ts0[s]) * 1e3 for s in steps if s + 1 in ts0}
    windows: list[tuple[int, int]] = []
    for sv in saves:
        k = sv["step"]
        m = max([s for s in steps if ts0[s] <= sv["done_at"]] + [k])
        sv["steps_in_flight"] = m - k
        sv["window"] = (k, m)
        windows.append((k, m))
    for t0, t1 in pauses:
        windows.append((max([s for s in steps if ts0[s] <= t0] + [0]), max([s for s in steps if ts0[s] <= t1] + [0])))
    busy = {s for a, b in windows for s in range(a, b + 1)}
    clean = [v for s, v in interval.items() if s > WARMUP_STEP and s not in busy]
    baseline = median(clean)
    baseline_step_ms = median([v for s, v in step_ms0.items() if s > WARMUP_STEP + 1 and s - 1 not in busy])
    for sv in saves:
        k, m = sv["window"]
        sv["boundary_stall_ms"] = interval.get(k, float("nan")) - baseline
        sv["total_stall_ms"] = sum(interval.get(s, float("nan")) - baseline for s in range(k, m + 1))
        # the steps that ran while a background save was being written: their own step_ms (the
        # boundary, where staging and publishing happen, is outside step_ms)
        during = [step_ms0[s] for s in range(k + 1, m + 1) if s in step_ms0]
        sv["inflight_step_slowdown_ms"] = (sum(during) / len(during) - baseline_step_ms) if during else float("nan")

    def pick(kind, background, key):
        return [s[key] for s in saves if s["kind"] == kind and s["async"] == background]

    results = {}
    for kind in KINDS:
        nbytes = bytes_of[kind]
        save_mbps = median([b / s / 1e6 for b, s in zip(pick(kind, False, "bytes"),
                                                        pick(kind, False, "reply_seconds"))])
        save_wall_mbps = median([b / s / 1e6 for b, s in zip(pick(kind, False, "bytes"),
                                                             pick(kind, False, "wall_seconds"))])
        raw_mbps = median([x["bytes"] / x["seconds"] / 1e6 for x in raws if x["kind"] == kind])
        sync_stall = median(pick(kind, False, "total_stall_ms"))
        async_total = median(pick(kind, True, "total_stall_ms"))
        last_sync = [s for s in saves if s["kind"] == kind and not s["async"]][-1]
        last_async = [s for s in saves if s["kind"] == kind and s["async"]][-1]
        results[kind] = {
            "bytes": nbytes,
            "sync_save_seconds_median": round(median(pick(kind, False, "reply_seconds")), 3),
            "sync_save_MBps_median": round(save_mbps, 1),
            "sync_save_wall_MBps_median": round(save_wall_mbps, 1),
            "raw_write_seconds_median": round(median([x["seconds"] for x in raws if x["kind"] == kind]), 3),
            "raw_write_MBps_median": round(raw_mbps, 1),
            "ratio_save_over_raw": round(save_mbps / raw_mbps, 4),
            "target": 0.7,
            "target_met": save_mbps / raw_mbps >= 0.7,
            "sync_stall_ms_median": round(sync_stall, 1),
            "async_boundary_stall_ms_median": round(median(pick(kind, True, "boundary_stall_ms")), 1),
            "async_total_stall_ms_median": round(async_total, 1),
            "async_over_sync_total_stall": round(async_total / sync_stall, 4) if sync_stall > 0 else None,
            "async_steps_in_flight_median": median(pick(kind, True, "steps_in_flight")),
            "async_inflight_step_slowdown_ms_median": round(median(pick(kind, True, "inflight_step_slowdown_ms")), 1),
            "async_save_seconds_median": round(median(pick(kind, True, "reply_seconds")), 3),
            "sync_training_thread_seconds_median": round(median(pick(kind, False, "training_thread_s")), 3),
            "async_staging_seconds_median": round(median(pick(kind, True, "training_thread_s")), 3),
            "raw_sync_stall_ms": [round(x, 1) for x in pick(kind, False, "total_stall_ms")],
            "raw_async_boundary_stall_ms": [round(x, 1) for x in pick(kind, True, "boundary_stall_ms")],
            "raw_async_total_stall_ms": [round(x, 1) for x in pick(kind, True, "total_stall_ms")],
            "sync_phases_last_round": {"rank0": last_sync["phases_rank0"], "rank1": last_sync["phases_rank1"]},
            "async_phases_last_round": {"rank0": last_async["phases_rank0"], "rank1": last_async["phases_rank1"]},
        }
    print(json.dumps({
        "benchmark": "checkpoint_throughput_and_stall", "model_size": args.model_size, "ranks": NPROC,
        "strategy": "ddp", "batch_size": args.batch_size, "seq_len": args.seq_len, "rounds": args.rounds,
        "ranks_paused_during_raw_write": not args.no_pause,
        "baseline_step_interval_ms_median": round(baseline, 1), "baseline_intervals": len(clean),
        "baseline_step_ms_median": round(baseline_step_ms, 1),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "wall_seconds": round(time.time() - started, 1),
        "kinds": results,
    }, indent=2))


if __name__ == "__main__":
    main()
