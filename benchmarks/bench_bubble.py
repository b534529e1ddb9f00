"""Pipeline bubble measured against theory and against the replayed schedule, N=2, M in 1..16.

One 2-rank CPU run of the agent with `--strategy pp`; the micro-batch count is raised live with
`set micro_batches` (as a user would from the UI). For each M: the mean measured bubble over the
sampled steps (1 − Σbusy / Σwindow over both stages, from the Timeline messages), the theory
(N−1)/(N+M−1), and the schedule replayed with the measured per-op times (imbalance), plus transfers
and per-op overhead (metrics.costs.pipeline_bubble.explain_bubble).

    python benchmarks/bench_bubble.py [--schedule gpipe|1f1b] [--steps-per-m 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from ringtop.cli.ctl import send_command
from ringtop.cli.launch import stop_ranks
from ringtop.metrics.costs.pipeline_bubble import explain_bubble
from ringtop.protocol import Timeline, free_tcp_ports, read_log

MICRO_BATCHES = (1, 2, 4, 8, 16)


def timelines(log_dir: Path) -> list[Timeline]:
    return [m for path in log_dir.glob("rank-*.jsonl") for m in read_log(path) if isinstance(m, Timeline)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b"))
    parser.add_argument("--steps-per-m", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    ports = free_tcp_ports(3)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "logs"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "ringtop.agent", "--strategy", "pp", "--pp-schedule", args.schedule, "--micro-batches", "1",
               "--steps", "0", "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
               "--log-dir", str(log_dir), "--publish", f"tcp://127.0.0.1:{ports[0]}",
               "--relay", f"tcp://127.0.0.1:{ports[1]}", "--control", f"tcp://127.0.0.1:{ports[2]}",
               "--checkpoint-dir", str(Path(tmp) / "ckpt")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        control = f"tcp://127.0.0.1:{ports[2]}"
        try:
            time.sleep(8)
            for m in MICRO_BATCHES:
                if m != 1:
                    reply = list(send_command(control, "set", {"micro_batches": m}, timeout_s=120))[-1]
                    assert reply.status == "done", reply.error
                while len([t for t in timelines(log_dir) if t.micro_batches == m]) < 2 * args.steps_per_m // 5:
                    time.sleep(0.5)
            list(send_command(control, "stop", {}, timeout_s=120))
            proc.wait(60)
        finally:
            stop_ranks(proc)
        by_step: dict[tuple[int, int], dict[int, Timeline]] = defaultdict(dict)
        for t in timelines(log_dir):
            by_step[(t.micro_batches, t.step)][t.stage] = t
    rows = []
    for m in MICRO_BATCHES:
        measured, replay_imbalance, replay_full, theory = [], [], [], None
        for (mb, _), stages in sorted(by_step.items()):
            if mb != m or len(stages) != 2:
                continue
            events = [(t.stage, s.micro_batch, s.op, t.window_start_ms + s.start_ms, t.window_start_ms + s.end_ms)
                      for t in stages.values() for s in t.spans]
            windows = {t.stage: (t.window_start_ms, t.window_start_ms + t.window_ms) for t in stages.values()}
            b = explain_bubble(events, args.schedule, 2, m, window_ms=windows)
            measured.append(b.measured)
            replay_imbalance.append(b.replay_imbalance)
            replay_full.append(b.replay_overhead)
            theory = b.theory
        rows.append({"micro_batches": m, "steps": len(measured), "theory": round(theory, 3),
                     "measured": round(statistics.mean(measured), 3),
                     "replay_measured_ops": round(statistics.mean(replay_imbalance), 3),
                     "replay_with_transfers_and_overhead": round(statistics.mean(replay_full), 3)})
    print(json.dumps({"stages": 2, "schedule": args.schedule, "batch_size": args.batch_size, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
