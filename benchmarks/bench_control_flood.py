"""Rank 0's step time while a client floods its control socket, vs the same run left alone (issue 29).

2 gloo ranks, tiny-gpt 1m, trained until stopped. Each round has two windows of `--window-s` (6 s:
the issue saw steps slowed for about that long), in an order that alternates from round to round:
in one nothing is sent; in the other one DEALER sends 20,000 `status` commands (encoded before
any window) as fast as it can (0.6 s in the issue's report), then reads what comes back for the
rest of the window. The flooder runs on the same cores as the ranks, as the issue's did. Rank 0's
steps are taken from its log by their end time; per round the ratio of the two windows' median
step times (flood / quiet); reported: the median of the rounds' ratios (target <= 1.1) and how
many replies the flood got (the burst and one `busy` per silence, not 20,000). Plain sockets
(--insecure): the limit is the same for any peer, and the flood then costs rank 0 no decryption.

    python benchmarks/bench_control_flood.py [--rounds 10] [--window-s 6]
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

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import kill, start_agents, stop  # noqa: E402

from ringtop.protocol import Command, encode  # noqa: E402

FLOOD_FRAMES = 20_000


def flood(sock: zmq.Socket, frames: list[bytes], until: float) -> dict:
    t0 = time.perf_counter()
    for frame in frames:
        sock.send(frame, copy=False)
    sent_s = time.perf_counter() - t0
    replies = busy = 0
    while time.time() < until:
        if sock.poll(100):
            replies += 1
            busy += b"busy" in sock.recv()
    return {"sent_s": round(sent_s, 3), "replies": replies, "busy": busy}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window-s", type=float, default=6.0, help="the issue saw steps slowed for ~6 s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = start_agents(Path(tmp), 2, "--steps", "0", "--insecure", "--model-size", "1m")
        try:
            run.wait_for_step(5, timeout_s=300)
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(run.control)
            frames = [encode(Command(id=f"f{i}", cmd="status")) for i in range(FLOOD_FRAMES)]  # before any window
            windows = []
            for r in range(args.rounds):
                for flooded in ((False, True) if r % 2 == 0 else (True, False)):
                    start = time.time()
                    end = start + args.window_s
                    info = flood(sock, frames, end) if flooded else {}
                    time.sleep(max(0.0, end - time.time()))
                    windows.append({"round": r, "flood": flooded, "start": start, "end": end, **info})
                    print(f"round {r} {'flood' if flooded else 'quiet'} {info}", file=sys.stderr, flush=True)
            sock.close()
            stop(run)
        except BaseException:
            kill(run)
            raise
        steps = run.steps(0)
    rounds = []
    for r in range(args.rounds):
        medians = {}
        for w in (w for w in windows if w["round"] == r):
            ms = [s.step_ms for s in steps if w["start"] <= s.ts < w["end"]]
            medians[w["flood"]] = statistics.median(ms) if ms else float("nan")
        flood_window = next(w for w in windows if w["round"] == r and w["flood"])
        rounds.append({"quiet_ms": medians[False], "flood_ms": medians[True], "ratio": medians[True] / medians[False],
                       "flood_replies": flood_window["replies"], "flood_busy": flood_window["busy"],
                       "flood_sent_s": flood_window["sent_s"]})
    ratios = [r["ratio"] for r in rounds]
    print(json.dumps({
        "benchmark": "control_flood", "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "frames_per_flood": FLOOD_FRAMES, "window_s": args.window_s, "rounds": rounds,
        "flood_over_quiet": round(statistics.median(ratios), 4),
        "ratio_range": [round(min(ratios), 4), round(max(ratios), 4)], "target": 1.1,
        "load_average": os.getloadavg(),
    }, indent=1))


if __name__ == "__main__":
    main()
