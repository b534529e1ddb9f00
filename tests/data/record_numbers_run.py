"""Records tests/data/numbers_run/: one short 2-rank run of each of ddp, a 2-stage pipeline, zero1
and fsdp grad-op, with the real agent (`ringtop run`, CPU, gloo, the built-in 1M model), for
tests/ui/test_numbers_agree.py. Run from the repository root: `python tests/data/record_numbers_run.py`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "numbers_run"
RUNS = {
    "ddp": ["--strategy", "ddp"],
    "pp": ["--strategy", "pp", "--pp-stages", "2", "--micro-batches", "2"],
    "zero1": ["--strategy", "zero1"],
    "fsdp-grad-op": ["--strategy", "fsdp", "--fsdp-sharding", "grad-op"],
}


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    for name, args in RUNS.items():
        logs = OUT / name
        cmd = [sys.executable, "-m", "ringtop.cli", "run", "--nproc", "2", *args, "--steps", "30",
               "--batch-size", "4", "--seq-len", "32", "--seed", "7", "--device", "cpu", "--print-every", "0",
               "--run-id", f"numbers-{name}", "--log-dir", str(logs)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
            return done.returncode
        print(name, sorted(p.name for p in logs.iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
