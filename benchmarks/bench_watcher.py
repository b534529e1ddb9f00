"""What the watcher process (agent/watcher/) costs the training, and its own CPU (issue 31; target:
step time with / without <= 1.01).

A watcher cannot be switched on and off inside one run (it is a process the run starts), so this
alternates whole runs, `--run-pairs` pairs in ABBA order (bench_agent_overhead.py's method): 2 gloo
ranks on CPU, tiny-gpt 1m under torch's elastic launcher, `--steps` each, the first 5 dropped; a
step is the interval between step ends on rank 0. Arm A: the default (the head relay in the
watcher); arm B: `--no-watcher` (the head relay a thread of rank 0). The ratio of the run medians
with a t-interval over the pairs. The watcher's CPU: its user + system time at its last sample
(every 0.2 s) over its lifetime, in % of one core. `--neighbours K` keeps K busy loops running.

    python benchmarks/bench_watcher.py [--run-pairs 6] [--steps 60] [--neighbours 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _block_stats import block_is_a, t_ratio
from bench_agent_overhead import launcher, neighbours, run_median_ms, telemetry_args

TARGET = 1.01
WATCHER = "ringtop.agent.watcher"


class WatcherCpu:
    """Samples the watcher's CPU seconds and lifetime under `root` until it ends."""

    def __init__(self, root: int) -> None:
        self.root, self.cpu_s, self.alive_s = root, 0.0, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        watcher = None
        while not self._done.wait(0.2):
            try:
                if watcher is None:
                    kids = psutil.Process(self.root).children(recursive=True)
                    watcher = next((p for p in kids if WATCHER in " ".join(p.cmdline())), None)
                if watcher is not None:
                    t = watcher.cpu_times()
                    self.cpu_s = t.user + t.system
                    self.alive_s = time.time() - watcher.create_time()
            except psutil.Error:
                if watcher is not None:
                    return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(2)


def one_run(arm: str, common: list[str], steps: int, work: Path) -> dict:
    work.mkdir()
    out = work / "steps.json"
    cmd = launcher("-m", "ringtop.agent", *common, "--steps", str(steps), *telemetry_args(work),
                   "--step-times", str(out), *(["--no-watcher"] if arm == "in_rank" else []))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RINGTOP_PREWARM": "0"})
    cpu = WatcherCpu(proc.pid)
    output, _ = proc.communicate()
    cpu.stop()
    if proc.returncode != 0:
        raise SystemExit(output[-3000:])
    result = {"median_ms": round(run_median_ms(out), 3)}
    if arm == "watcher":
        if cpu.alive_s <= 0:
            raise SystemExit("no watcher process was seen in a default run")
        result.update(watcher_cpu_s=round(cpu.cpu_s, 3), watcher_alive_s=round(cpu.alive_s, 2),
                      watcher_core_pct=round(100 * cpu.cpu_s / cpu.alive_s, 2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--neighbours", type=int, default=0)
    parser.add_argument("--model-size", default="1m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    common = ["--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--model-size", args.model_size]
    rounds = []
    started = time.monotonic()
    with neighbours(args.neighbours), tempfile.TemporaryDirectory() as tmp:
        for r in range(args.run_pairs):
            order = ("watcher", "in_rank") if block_is_a(2 * r, seed=None) else ("in_rank", "watcher")
            got = {arm: one_run(arm, common, args.steps, Path(tmp) / f"pair{r}-{arm}") for arm in order}
            rounds.append({"order": list(order), **got})
            print(f"pair {r + 1}/{args.run_pairs}: watcher {got['watcher']['median_ms']:.1f} ms, "
                  f"in rank 0 {got['in_rank']['median_ms']:.1f} ms; the watcher "
                  f"{got['watcher']['watcher_core_pct']:.1f} % of a core", file=sys.stderr, flush=True)
    ratios = [p["watcher"]["median_ms"] / p["in_rank"]["median_ms"] for p in rounds]
    ratio = t_ratio(ratios) if len(ratios) > 1 else None
    core = sorted(p["watcher"]["watcher_core_pct"] for p in rounds)
    result = {"benchmark": "bench_watcher", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "settings": {**vars(args), "ranks": 2, "cpus": os.cpu_count()},
              "wall_s": round(time.monotonic() - started, 1), "pairs": rounds,
              "watcher_over_in_rank": ratio.as_dict() if ratio else None, "target": TARGET,
              "watcher_core_pct_median": core[len(core) // 2]}
    if args.json:
        print(json.dumps(result, indent=1))
    elif ratio:
        print(f"step time, watcher / relay in rank 0 ({ratio.pairs} run pairs): {ratio.ratio:.4f}, 95% CI "
              f"{ratio.low:.4f}-{ratio.high:.4f}; target <= {TARGET}\n"
              f"the watcher's CPU: {result['watcher_core_pct_median']:.2f} % of one core (median of the runs)")


if __name__ == "__main__":
    main()
