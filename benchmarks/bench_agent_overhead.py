"""The agent's per-step overhead, measured in the same run on the same machine.

Four arms, 2 gloo ranks on CPU, launched through torch's elastic launcher and alternated for
several rounds: a plain hand-written DDP loop (benchmarks/plain_ddp.py), the agent with
`--no-telemetry` (the same loop inside ringtop, no sockets, tracing or sampling), the agent with
everything on but `--insecure` (plain sockets), and the agent as it runs by default (everything
on, every socket authenticated and encrypted with CURVE). Each arm records the
wall time at the end of every step on rank 0; a step's time is the interval between consecutive
ends, so per-step syncs, tracing and publishing are inside it. The arms' order rotates from round
to round. Reports medians and, as the median (and range) of the per-round ratios, agent/plain
(target <= 1.03), agent/no-telemetry, the cost of telemetry and tracing (target <= 1.01), and
agent/insecure, the cost of CURVE (target <= 1.01).

    python benchmarks/bench_agent_overhead.py [--rounds 5] [--steps 40]
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

from ringtop.protocol import free_tcp_ports

HERE = Path(__file__).resolve().parent
WARMUP_STEPS = 5


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


def intervals(path: Path) -> list[float]:
    ends = json.loads(path.read_text())[WARMUP_STEPS:]
    return [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]


def run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-2000:])


def run_plain(work: Path, common: list[str]) -> list[float]:
    out = work / "plain.json"
    run(launcher(str(HERE / "plain_ddp.py"), *common, "--out", str(out)))
    return intervals(out)


def run_agent(work: Path, common: list[str], telemetry: bool, insecure: bool = False) -> list[float]:
    out = work / f"agent-{telemetry}-{insecure}.json"
    if telemetry:
        p = free_tcp_ports(3)
        extra = ["--log-dir", str(work / f"logs-{insecure}"), "--publish", f"tcp://127.0.0.1:{p[0]}",
                 "--relay", f"tcp://127.0.0.1:{p[1]}", "--control", f"tcp://127.0.0.1:{p[2]}"]
        if insecure:
            extra.append("--insecure")
    else:
        extra = ["--no-telemetry"]
    run(launcher("-m", "ringtop.agent", *common, *extra, "--step-times", str(out),
                 "--checkpoint-dir", str(work / "ckpt")))
    return intervals(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model-size", default="1m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    common = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
              "--model-size", args.model_size]
    arms = {
        "plain": lambda work: run_plain(work, common),
        "agent_no_telemetry": lambda work: run_agent(work, common, telemetry=False),
        "agent_insecure": lambda work: run_agent(work, common, telemetry=True, insecure=True),
        "agent": lambda work: run_agent(work, common, telemetry=True),
    }
    names = list(arms)
    steps: dict[str, list[float]] = {k: [] for k in names}
    per_round: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            work = Path(tmp) / f"round{r}"
            work.mkdir()
            # The order rotates: on a machine that drifts within a run, a fixed order would bias
            # whichever arm always runs last.
            order = names[r % len(names):] + names[:r % len(names)]
            medians = {}
            for name in order:
                got = arms[name](work)
                steps[name] += got
                medians[name] = statistics.median(got)
            per_round.append(medians)
            print(f"round {r + 1}/{args.rounds} ({' → '.join(order)}): " + ", ".join(
                f"{k} {medians[k]:.2f} ms" for k in names), file=sys.stderr)

    def ratio(a: str, b: str) -> dict[str, float]:
        """Median and range of the per-round ratios: each round's arms ran minutes apart at most."""
        rs = [m[a] / m[b] for m in per_round]
        return {"median": round(statistics.median(rs), 4), "min": round(min(rs), 4), "max": round(max(rs), 4)}

    print(json.dumps({
        "model_size": args.model_size, "ranks": 2, "rounds": args.rounds,
        "steps_measured_per_run": args.steps - WARMUP_STEPS - 1,
        "step_ms_median": {k: round(statistics.median(v), 3) for k, v in steps.items()},
        "per_round_step_ms_median": [{k: round(v, 3) for k, v in m.items()} for m in per_round],
        "ratio_agent_over_plain": ratio("agent", "plain"), "target_agent_over_plain": 1.03,
        "ratio_agent_over_no_telemetry": ratio("agent", "agent_no_telemetry"),
        "target_telemetry_and_tracing": 1.01,
        "ratio_curve_on_over_off": ratio("agent", "agent_insecure"), "target_curve": 1.01,
    }, indent=2))


if __name__ == "__main__":
    main()
