"""The agent's DDP step time against a plain hand-written DDP loop, same run, same machine.

Both are launched through torch's elastic launcher with 2 gloo ranks on CPU, alternating A/B for
several rounds; a step's time is the interval between consecutive step ends on rank 0 (so the
agent's per-step control sync, tracing and publishing are all inside it). Reports the ratio of
medians, agent / plain (target <= 1.03), and the agent with --no-telemetry as a second reference.

    python benchmarks/bench_agent_overhead.py [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ringtop.protocol import Step, free_tcp_port, from_json_line

HERE = Path(__file__).resolve().parent
WARMUP_STEPS = 5


def launcher(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def intervals(ends: list[float]) -> list[float]:
    ends = ends[WARMUP_STEPS:]
    return [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]


def run_plain(work: Path, common: list[str]) -> list[float]:
    out = work / "plain.json"
    subprocess.run(launcher(2, str(HERE / "plain_ddp.py"), *common, "--out", str(out)), check=True,
                   capture_output=True)
    return intervals(json.loads(out.read_text()))


def run_agent(work: Path, common: list[str], telemetry: bool) -> list[float]:
    log_dir = work / f"agent-{telemetry}"
    extra = []
    if telemetry:
        ports = [free_tcp_port() for _ in range(3)]
        extra = ["--log-dir", str(log_dir), "--publish", f"tcp://127.0.0.1:{ports[0]}",
                 "--relay", f"tcp://127.0.0.1:{ports[1]}", "--control", f"tcp://127.0.0.1:{ports[2]}"]
    else:
        extra = ["--no-telemetry"]
    result = subprocess.run(launcher(2, "-m", "ringtop.agent", *common, *extra), capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-2000:])
    if not telemetry:
        return []
    steps = [m for m in map(from_json_line, (log_dir / "rank-0.jsonl").read_bytes().splitlines()) if isinstance(m, Step)]
    return intervals([s.ts for s in steps])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model-size", default="1m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    common = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
              "--model-size", args.model_size]
    plain, agent = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            work = Path(tmp) / f"round{r}"
            work.mkdir()
            plain += run_plain(work, common)
            agent += run_agent(work, common, telemetry=True)
            print(f"round {r + 1}/{args.rounds}: plain {statistics.median(plain):.2f} ms, "
                  f"agent {statistics.median(agent):.2f} ms", file=sys.stderr)
    p, a = statistics.median(plain), statistics.median(agent)
    print(json.dumps({
        "model_size": args.model_size, "ranks": 2, "steps_measured_per_run": args.steps - WARMUP_STEPS - 1,
        "rounds": args.rounds, "plain_step_ms_median": round(p, 3), "agent_step_ms_median": round(a, 3),
        "ratio_agent_over_plain": round(a / p, 4), "target": 1.03,
    }, indent=2))


if __name__ == "__main__":
    main()
