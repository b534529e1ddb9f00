"""The diagnosis exchange's time and bytes at 2, 4 and 8 gloo ranks (issue 15: O(1) bytes per rank).

In one run per world size, the exchange as it is (a reduce of fixed-size histograms and three
rounds of top-k reductions, agent/health/diagnosis_exchange.py) alternates with the all-gather of every
rank's window it replaced (benchmarks/_diagnosis_worker.py), 30 rounds each, the order rotated,
each between barriers. Reports the median time of each and the bytes each rank hands to the
collectives: constant for the sketch; for the all-gather, what each rank receives grows with N.

    python benchmarks/bench_diagnosis_exchange.py [--ranks 2,4,8] [--rounds 30]
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

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2,4,8")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for n in (int(x) for x in args.ranks.split(",")):
            out = Path(work) / f"{n}.json"
            print(f"{n} ranks ...", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc_per_node={n}", str(HERE / "_diagnosis_worker.py"), "--rounds",
                                   str(args.rounds), "--out", str(out)], capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            if done.returncode != 0:
                raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
            d = json.loads(out.read_text())
            rows.append({
                "ranks": n, "sketch_ms_median": round(statistics.median(d["times"]["sketch"]), 3),
                "gather_ms_median": round(statistics.median(d["times"]["gather"]), 3),
                "sketch_bytes_per_rank": round(d["sketch_bytes_sent_per_rank"]),
                "gather_bytes_received_per_rank": d["gather_bytes_received_per_rank"],
                "same_verdicts": d["verdicts"]["sketch"] == d["verdicts"]["gather"],
            })
    print(json.dumps({"benchmark": "bench_diagnosis_exchange", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                      "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
