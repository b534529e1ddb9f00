"""The collective ledger's cost on step time (issue 14, target <= 1.01).

2 gloo ranks on CPU, tiny-gpt 1m, DDP and FSDP (FSDP issues a collective per layer and direction,
the most the ledger is asked to record). In one process per rank the same strategy trains with two
recorders alternated in blocks of steps, the order rotated each round: the tracer as it is (each
collective gets a per-group seq, a shapes digest, a ledger entry in the ring, a per-step digest) and
the tracer as it was before the ledger (benchmarks/_ledger_worker.py). Reports, per strategy, the
median of the per-round ratios of block medians, ledger / bare, and their range; and, as these
machines are noisier than the effect, the bookkeeping alone: µs per traced collective for both
(alternated, median of 7 x 20,000 calls) x the collectives a step issues / the step time,
`bookkeeping_over_step` = 1 + that.

    python benchmarks/bench_ledger.py [--rounds 8] [--block 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--strategies", default="ddp,fsdp")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for strategy in args.strategies.split(","):
            out = Path(work) / f"{strategy}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   str(HERE / "_ledger_worker.py"), "--strategy", strategy, "--rounds", str(args.rounds),
                   "--block", str(args.block), "--out", str(out)]
            print(f"{strategy} ...", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, env={**_env(), "OMP_NUM_THREADS": "1"})
            if done.returncode != 0:
                raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
            data = json.loads(out.read_text())
            ratios = [r["ledger"] / r["bare"] for r in data["rounds"]]
            us = data["per_call_us"]
            extra_ms = (us["ledger"] - us["bare"]) * data["calls_per_step"] / 1e3
            results[strategy] = {
                "ledger_over_bare": round(statistics.median(ratios), 4),
                "per_call_us": {k: round(v, 3) for k, v in us.items()},
                "collectives_per_step": data["calls_per_step"],
                "bookkeeping_over_step": round(1 + extra_ms / statistics.median(data["times"]["bare"]), 5),
                "per_round_range": [round(min(ratios), 4), round(max(ratios), 4)],
                "ledger_median_ms": round(statistics.median(data["times"]["ledger"]), 3),
                "bare_median_ms": round(statistics.median(data["times"]["bare"]), 3),
                "steps_per_arm": len(data["times"]["ledger"]),
            }
    print(json.dumps({"benchmark": "bench_ledger", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                      "rounds": args.rounds, "block": args.block, "target": "<= 1.01", "results": results},
                     indent=1))


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


if __name__ == "__main__":
    main()
