"""From a hung rank to a UI naming it (issue 14: target <= 2 x the median step + 5 s), beside the
collective timeout that would otherwise end the job (the agent's default, 600 s, as NCCL's).

2 gloo ranks on CPU; rank 1 hangs at step 30, in its model's forward or just before its next
collective (`--inject-hang`). A subscriber does what the UI does: it receives the telemetry over the
run's authenticated socket and runs the UI's reading (`ringtop.metrics.rules.hang.diagnose`) on every
stall report until it names rank 1. The fault's time is the start of the hung step (the stall
report's `ts - running_s`, the earliest rank's): an upper bound, as the fault comes a few ms into
that step. `detect_s` is until the reading names rank 1 with where it is (phase and frame);
`named_s` until it first names rank 1 at all (before rank 1's own report arrives: "sent no stall
report"). Reports per run both, the median step before the fault, the target, and both ratios.

    python benchmarks/bench_hang_detection.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import zmq
from _runs import start_agents

from ringtop.cli.ctl import send_command
from ringtop.cli.launch import stop_ranks
from ringtop.metrics.rules.hang import diagnose
from ringtop.protocol import Stall, Step, connection_file, decode
from ringtop.protocol.curve import secure_client

FAULT_STEP = 30
COLLECTIVE_TIMEOUT_S = 600.0


class Subscriber(threading.Thread):
    """The UI's side: telemetry in, the reading run on each stall report, the time it names rank 1."""

    def __init__(self, info: connection_file.ConnectionInfo, world_size: int) -> None:
        super().__init__(daemon=True)
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        secure_client(self.sock, info.keys)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(info.publish)
        self.world_size = world_size
        self.reports: dict[int, Stall] = {}
        self.first_stall_start: dict[int, float] = {}
        self.named_at: float | None = None
        self.located_at: float | None = None
        self.text = ""
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if not self.sock.poll(100):
                continue
            _, frame = self.sock.recv_multipart()
            msg = decode(frame)
            if isinstance(msg, Stall) and msg.state == "stalled":
                self.reports[msg.rank] = msg
                self.first_stall_start.setdefault(msg.rank, msg.ts - msg.running_s)
                verdict = diagnose(self.reports, self.world_size)
                if verdict is not None and verdict.culprits == (1,) and verdict.kind == "hang":
                    if self.named_at is None:
                        self.named_at = time.time()
                    if 1 in verdict.where:  # which rank, which collective, and where rank 1 is
                        self.located_at, self.text = time.time(), verdict.text
                        self.done.set()
            elif isinstance(msg, Step) and msg.rank in self.reports and msg.step >= self.reports[msg.rank].step:
                del self.reports[msg.rank]
        self.sock.close(0)


def one_run(work: Path, place: str) -> dict:
    run_id = uuid.uuid4().hex[:8]
    run = start_agents(work, 2, "--steps", "0", "--run-id", run_id, "--inject-hang", f"1:{FAULT_STEP}:{place}")
    info = None
    try:
        deadline = time.monotonic() + 120
        path = connection_file.file_for(run_id)
        while not path.exists():
            if time.monotonic() > deadline or run.proc.poll() is not None:
                raise SystemExit(f"no connection file:\n{run.output()[-2000:]}")
            time.sleep(0.05)
        info = connection_file.read(path)
        sub = Subscriber(info, 2)
        sub.start()
        if not sub.done.wait(180):
            raise SystemExit(f"the hang was not named within 180 s:\n{run.output()[-2000:]}")
        steps = [s.step_ms for s in run.steps(0) if 5 <= s.step < FAULT_STEP]
        median_ms = statistics.median(steps)
        fault_at = min(sub.first_stall_start.values())  # the hung step's start, on the earliest rank
        detect_s = sub.located_at - fault_at
        target_s = 2 * median_ms / 1e3 + 5.0
        return {"place": place, "detect_s": round(detect_s, 3), "named_s": round(sub.named_at - fault_at, 3),
                "median_step_ms": round(median_ms, 2),
                "target_s": round(target_s, 3), "detect_over_target": round(detect_s / target_s, 3),
                "detect_over_collective_timeout": round(detect_s / COLLECTIVE_TIMEOUT_S, 5), "text": sub.text}
    finally:
        try:  # the stuck run is stopped as a user would: `ctl stop` (the stall watch carries it out)
            if info is not None:
                list(send_command(info.control, "stop", {"reason": "benchmark"}, 30, info.keys))
            run.proc.wait(60)
        finally:
            stop_ranks(run.proc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.repeats):
            for place in ("forward", "before-collective"):
                print(f"{place} #{i + 1} ...", file=sys.stderr, flush=True)
                runs.append(one_run(Path(work) / f"{place}-{i}", place))
    print(json.dumps({
        "benchmark": "bench_hang_detection", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "fault_step": FAULT_STEP, "target": "detect_s <= 2 x median step + 5 s",
        "worst_detect_over_target": max(r["detect_over_target"] for r in runs),
        "median_detect_over_collective_timeout": statistics.median(r["detect_over_collective_timeout"] for r in runs),
        "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
