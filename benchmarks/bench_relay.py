"""The relay's throughput with CURVE on and off, measured in the same run.

Rank 0's relay validates and forwards every rank's messages to every UI. Here two publishers (as
two ranks, each with its own rank key) send real encoded `Step` messages into a relay and one
subscriber (a UI, with the client key) receives them; the time from the first send to the last
message received gives messages per second. Arms alternate for several rounds: plain sockets
(--insecure) and CURVE (the default). Reports the medians and the ratio CURVE / plain.

    python benchmarks/bench_relay.py [--rounds 5] [--messages 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import zmq

from ringtop.agent.gatekeeper import Gatekeeper
from ringtop.agent.relay import Relay
from ringtop.protocol import CommStat, Hello, Step, curve, encode, free_tcp_port
from ringtop.protocol.curve import secure_client

RANKS = 2


def step_frames(rank: int, n: int) -> list[list[bytes]]:
    """Steps as an agent publishes them (with one collective's stats), each a distinct message."""
    return [[f"step.{rank}".encode(),
             encode(Step(rank=rank, seq=i, step=i, loss=2.5, step_ms=120.0, forward_ms=40.0, backward_ms=60.0,
                         optimizer_ms=10.0, tokens=1024, grad_norm=1.0,
                         comm=[CommStat(kind="all_reduce", count=1, bytes=4_000_000, busy_ms=20.0,
                                        group_size=RANKS)]))]
            for i in range(n)]


def one_round(secure: bool, per_rank: int) -> float:
    """Messages per second through the relay."""
    keys = curve.generate(RANKS) if secure else None
    gate = Gatekeeper(keys) if keys is not None else None
    relay_addr, publish_addr = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    relay = Relay(relay_addr, publish_addr, run_id="bench", world_size=RANKS, gate=gate)
    if gate is not None:
        gate.start()
    relay.start()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    secure_client(sub, keys.client if keys else None)
    sub.connect(publish_addr)
    pubs = []
    for rank in range(RANKS):
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        secure_client(pub, keys.for_rank(rank) if keys else None)
        pub.connect(relay_addr)
        pubs.append(pub)
    try:
        hello = [b"hello.0", encode(Hello(rank=0, run_id="bench", world_size=RANKS))]
        deadline = time.monotonic() + 20
        while not sub.poll(50):  # until both hops are connected and subscribed
            pubs[0].send_multipart(hello)
            if time.monotonic() > deadline:
                raise SystemExit("the relay never connected")
        while sub.poll(200):
            sub.recv_multipart()
        frames = [step_frames(rank, per_rank) for rank in range(RANKS)]
        total = RANKS * per_rank
        got = 0
        done = threading.Event()

        def receive() -> None:
            nonlocal got
            while got < total and sub.poll(5000):
                sub.recv_multipart()
                got += 1
            done.set()

        receiver = threading.Thread(target=receive)
        start = time.perf_counter()
        receiver.start()
        for i in range(per_rank):
            for rank in range(RANKS):
                pubs[rank].send_multipart(frames[rank][i])
        done.wait()
        elapsed = time.perf_counter() - start
        receiver.join()
        if got < total:
            raise SystemExit(f"only {got} of {total} messages arrived (relay dropped {relay.dropped})")
        return total / elapsed
    finally:
        for sock in (sub, *pubs):
            sock.close(0)
        relay.stop()
        if gate is not None:
            gate.stop()
        ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20_000, help="per rank per round")
    args = parser.parse_args()
    arms: dict[str, list[float]] = {"plain": [], "curve": []}
    for r in range(args.rounds):
        for arm in arms:
            arms[arm].append(one_round(arm == "curve", args.messages))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:,.0f} msg/s" for k, v in arms.items()),
              file=sys.stderr)
    med = {k: statistics.median(v) for k, v in arms.items()}
    print(json.dumps({
        "ranks": RANKS, "messages_per_round": RANKS * args.messages, "rounds": args.rounds,
        "messages_per_s_median": {k: round(v) for k, v in med.items()},
        "ratio_curve_over_plain": round(med["curve"] / med["plain"], 4),
    }, indent=2))


if __name__ == "__main__":
    main()
