"""`ringtop report` on big logs: time to write the page and its size, growing steps and ranks.

The logs are `ringtop simulate`'s messages (cli/simulate/scenario.py: its Hello and Step per rank, a
straggler at rank 5, every rank's Bye), written as LOGDIR/rank-R.jsonl the way the agent writes
them; the report then reads them as it reads a real run's. Sizes: 8 ranks x 250 and 1,000 steps
(growth in steps), 256 and 1,024 ranks x 50 steps (growth in ranks). One JSON object on stdout.

    python benchmarks/bench_report.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from ringtop.cli.report import write_report
from ringtop.cli.simulate import Scenario, SimConfig
from ringtop.protocol import Bye, to_json_line

SIZES = ((8, 250), (8, 1000), (256, 50), (1024, 50))
"""(ranks, steps) of each log."""
STEP_S = 0.2


def write_logs(log_dir: Path, ranks: int, steps: int) -> int:
    """A simulated run's logs; returns their bytes."""
    scenario = Scenario(SimConfig(ranks=ranks, nodes=max(1, ranks // 8), straggler=5 if ranks > 5 else None,
                                  seconds=steps * STEP_S, hz=1 / STEP_S), run_id=f"bench{ranks}x{steps}")
    t0 = 1_800_000_000.0
    log_dir.mkdir(parents=True)
    total = 0
    for r in range(ranks):
        hello = msgspec.structs.replace(scenario.hello(r, t0), rank=r, ts=t0)
        lines = [to_json_line(hello)]
        lines += [to_json_line(msgspec.structs.replace(scenario.step(r, k), rank=r, seq=k, ts=t0 + 1 + k * STEP_S))
                  for k in range(1, steps + 1)]
        lines.append(to_json_line(Bye(rank=r, ts=t0 + 1.1 + steps * STEP_S, reason="completed", step=steps)))
        data = b"".join(lines)
        (log_dir / f"rank-{r}.jsonl").write_bytes(data)
        total += len(data)
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks, steps in SIZES:
            logs = Path(tmp) / f"{ranks}x{steps}"
            log_bytes = write_logs(logs, ranks, steps)
            out = Path(tmp) / f"{ranks}x{steps}.html"
            times = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                write_report(logs, out)
                times.append(time.perf_counter() - t)
            row = {"ranks": ranks, "steps": steps, "log_mb": round(log_bytes / 1e6, 2),
                   "report_s_median": round(statistics.median(times), 3), "report_s": [round(x, 3) for x in times],
                   "html_mb": round(out.stat().st_size / 1e6, 2)}
            print(json.dumps(row), file=sys.stderr)
            results.append(row)
            out.unlink()
    print(json.dumps({"bench": "report", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "load_avg": os.getloadavg(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
