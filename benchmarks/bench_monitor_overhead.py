"""ringtop.Monitor's per-step cost on a script's own DDP loop, in the same processes.

2 gloo ranks on CPU under torch's elastic launcher, tiny-gpt 1m, batch 8, seq 128, AdamW (as
`bench_agent_overhead.py`'s plain loop). Each round trains the same loop twice, in an order that
alternates from round to round: once plain, once on a second copy of the model watched by a
`ringtop.Monitor` (created and closed within the round: its telemetry thread, sampler, stall
watch, relay and control server run only during its arm). A step's time is the interval between
consecutive step ends on rank 0 (after warm-up steps), so the Monitor's hooks, tracing, step
boundary and publishing are inside it. Reports the medians and the median (and range) of the
per-round ratios watched / plain (target <= 1.03, the agent's).

    python benchmarks/bench_monitor_overhead.py [--rounds 6] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP_STEPS = 5


def arm(watched: bool, steps: int, log_dir: str) -> list[float]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringtop
    from ringtop.agent.models.data import global_batch
    from ringtop.agent.models.model import MODEL_SIZES, build_tiny_gpt
    from ringtop.protocol import free_tcp_port

    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(build_tiny_gpt("1m", 0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    vocab = MODEL_SIZES["1m"].vocab_size
    mon = None
    if watched:
        publish, relay, control = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(3))
        mon = ringtop.Monitor(model, optimizer, log_dir=log_dir, publish=publish, relay=relay, control=control)
    ends = []
    for step in range(steps):
        with mon.step() if mon is not None else _nothing() as s:
            inputs, targets = global_batch(step, rank, world, 8, 128, vocab, 0)
            optimizer.zero_grad(set_to_none=True)
            loss = model(inputs, targets)
            loss.backward()
            optimizer.step()
            if s is not None:
                s.loss = loss
        loss.item()
        ends.append(time.time())
    if mon is not None:
        mon.close()
    ends = ends[WARMUP_STEPS:]
    return [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def worker(rounds: int, steps: int, out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    results = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        times = {watched: arm(watched, steps, str(out / f"logs-{r}")) for watched in order}
        results.append({"plain_ms": statistics.median(times[False]), "watched_ms": statistics.median(times[True])})
    if dist.get_rank() == 0:
        (out / "rounds.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--worker", default="")
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.steps, Path(args.worker))
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RINGTOP_PREWARM": "0"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
               "--rounds", str(args.rounds), "--steps", str(args.steps), "--worker", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
        rounds = json.loads((Path(tmp) / "rounds.json").read_text())
    ratios = [r["watched_ms"] / r["plain_ms"] for r in rounds]
    print(json.dumps({
        "benchmark": "monitor_overhead", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "rounds": rounds, "plain_ms_median": statistics.median(r["plain_ms"] for r in rounds),
        "watched_ms_median": statistics.median(r["watched_ms"] for r in rounds),
        "watched_over_plain": round(statistics.median(ratios), 4),
        "ratio_range": [round(min(ratios), 4), round(max(ratios), 4)], "target": 1.03,
        "load_average": os.getloadavg(),
    }, indent=1))


if __name__ == "__main__":
    main()
