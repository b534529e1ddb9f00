"""The head relay's throughput as a multi-node run uses it, CURVE on and off.

Rank 0's relay validates every message (a full decode, its topic, its rank against the sender's
key or node relay's `carriers`, seq gaps and duplicates) and forwards it to every UI. Here the
relay runs in this process as a run starts it (a `Relay` thread, with a `Gatekeeper` for CURVE);
each load generator is a process of its own, so the relay is measured, not the GIL it would share
with them: `--nodes` sender processes each play one node relay (its node key, its ranks, its
upstream socket options) and send pre-encoded `Step`s of their ranks in batches of `--batch`
(protocol/batch.py, as a node relay sends them; 1: one message per ZeroMQ message, as node relays
sent them before batching); one subscriber process (a UI, with the client key) counts what
arrives. A round's rate is the messages received divided by the time from the senders' start to
the last message received; the relay's, the messages it forwarded by the time it had forwarded
them all (it can be more: the relay drops what a slow UI leaves past its 10,000-message queue, as
in a run). Arms alternate for several rounds: plain sockets (--insecure), CURVE (the default),
and CURVE with a second UI subscribed to the relay's digests (`digests`: the relay then also folds
every step into them, agent/transport/step_digest.py; that UI counts the steps the digests carry, whole or
as briefs); reports the medians and the ratios CURVE / plain and digests / CURVE (with --json, as
JSON with every round's counts: received, the relay's forwarded, dropped, gaps and duplicates).

    python benchmarks/bench_relay.py [--rounds 5] [--messages 100000] [--nodes 2] [--batch 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import datetime, timezone

import zmq

from ringtop.agent.transport.gatekeeper import Gatekeeper, node_user
from ringtop.agent.transport.node_relay import HEARTBEAT_IVL_MS, QUEUE_CAPACITY
from ringtop.agent.transport.relay import Relay
from ringtop.protocol import CommStat, Hello, Step, curve, encode, free_tcp_port
from ringtop.protocol.batch import encode_batch
from ringtop.protocol.curve import ClientKeys, secure_client

RANKS_PER_NODE = 8
RUN_ID = "bench"
IDLE_S = 5.0
"""The subscriber stops once nothing has arrived for this long (the relay dropped some)."""


def step_frames(rank: int, n: int, world: int) -> list[list[bytes]]:
    """Steps as an agent publishes them (with one collective's stats), each a distinct message."""
    return [[f"step.{rank}".encode(),
             encode(Step(rank=rank, seq=i + 1, step=i, loss=2.5, step_ms=120.0, forward_ms=40.0, backward_ms=60.0,
                         optimizer_ms=10.0, tokens=1024, grad_norm=1.0, ts=1.7e9,
                         comm=[CommStat(kind="all_reduce", count=1, bytes=4_000_000, busy_ms=20.0,
                                        group_size=world)]))]
            for i in range(n)]


def sender(address: str, keys: ClientKeys | None, ranks: list[int], per_rank: int, batch: int, world: int,
           go, ready, loaded, hello: bool) -> None:
    """One node relay's upstream: its socket as node_relay.py sets it up, its ranks' steps in order."""
    ctx = zmq.Context()
    up = ctx.socket(zmq.XPUB)
    up.setsockopt(zmq.XPUB_NODROP, 1)
    up.setsockopt(zmq.SNDHWM, max(1, QUEUE_CAPACITY // batch))
    up.setsockopt(zmq.LINGER, 5000)
    up.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    secure_client(up, keys)
    up.connect(address)
    up.recv()  # the head's subscription
    per = [step_frames(rank, per_rank, world) for rank in ranks]
    messages = [per[r][i] for i in range(per_rank) for r in range(len(ranks))]
    packed = messages if batch == 1 else [[encode_batch(messages[i:i + batch])]
                                          for i in range(0, len(messages), batch)]
    loaded.set()
    if hello:  # until the UI is subscribed through the relay
        frames = [f"hello.{ranks[0]}".encode(), encode(Hello(rank=ranks[0], run_id=RUN_ID, world_size=world))]
        while not ready.wait(0.05):
            up.send_multipart(frames)
    go.wait()
    for frames in packed:
        up.send_multipart(frames)
    up.close()
    ctx.term()


def subscriber(address: str, keys: ClientKeys | None, total: int, ready, out) -> None:
    """A UI: counts the steps that arrive; sends (count, monotonic time of the last one) to `out`."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    secure_client(sub, keys)
    sub.connect(address)
    got, last = 0, 0.0
    while not sub.poll(50):
        pass
    ready.set()
    recv = zmq.backend.Socket.recv  # libzmq's, not pyzmq's Python layer: the load generator stays light
    while got < total and sub.poll(int(IDLE_S * 1000)):
        try:
            while True:
                topic, _ = recv(sub, zmq.NOBLOCK), recv(sub, 0)  # the relay sends 2 frames a message
                if topic.startswith(b"step."):
                    got += 1
                    last = time.monotonic()
        except zmq.Again:
            pass
    out.send((got, last))
    sub.close(0)
    ctx.term()


def digest_subscriber(address: str, keys: ClientKeys | None, stop, out) -> None:
    """A large run's UI: digests only; sends (digests, steps they carried) to `out` once `stop` is set."""
    from ringtop.protocol import decode

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"digest.")
    sub.setsockopt(zmq.RCVHWM, 0)
    secure_client(sub, keys)
    sub.connect(address)
    digests = steps = 0
    while not stop.is_set():
        if sub.poll(50):
            d = decode(sub.recv_multipart()[1])
            digests += 1
            steps += len(d.steps) + len(d.briefs)
    out.send((digests, steps))
    sub.close(0)
    ctx.term()


def one_round(secure: bool, nodes: int, per_rank: int, batch: int, digests: bool = False) -> dict:
    world = (nodes + 1) * RANKS_PER_NODE  # node 0 is the head's: its ranks publish no load here
    node_ranks = [list(range((k + 1) * RANKS_PER_NODE, (k + 2) * RANKS_PER_NODE)) for k in range(nodes)]
    keys = curve.generate(world, node_relays=nodes) if secure else None
    gate = Gatekeeper(keys) if keys is not None else None
    relay_addr, publish_addr = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    relay = Relay(relay_addr, publish_addr, run_id=RUN_ID, world_size=world, gate=gate,
                  carriers={node_user(k): ranks for k, ranks in enumerate(node_ranks)})
    if gate is not None:
        gate.start()
    relay.start()
    spawn = mp.get_context("spawn")
    go, ready = spawn.Event(), spawn.Event()
    loaded = [spawn.Event() for _ in node_ranks]
    receive, result = spawn.Pipe(duplex=False)
    total = nodes * RANKS_PER_NODE * per_rank
    procs = [spawn.Process(target=subscriber, args=(publish_addr, keys.client if keys else None, total, ready,
                                                    result))]
    digest_stop = spawn.Event()
    digest_receive, digest_result = spawn.Pipe(duplex=False)
    if digests:
        procs.append(spawn.Process(target=digest_subscriber, args=(publish_addr, keys.client if keys else None,
                                                                   digest_stop, digest_result)))
    procs += [spawn.Process(target=sender, args=(relay_addr, keys.for_node(k) if keys else None, ranks, per_rank,
                                                 batch, world, go, ready, loaded[k], k == 0))
              for k, ranks in enumerate(node_ranks)]
    try:
        for p in procs:
            p.start()
        if not ready.wait(120):
            raise SystemExit("the subscriber never got through the relay")
        if not all(e.wait(120) for e in loaded):
            raise SystemExit("a sender never got its messages ready")
        wait_digests = time.monotonic() + 60
        while digests and not relay._digest_wanted:
            if time.monotonic() > wait_digests:
                raise SystemExit("the digest subscriber never subscribed")
            time.sleep(0.01)
        before = relay.forwarded
        start = time.monotonic()
        go.set()
        relay_done, deadline = None, start + 300
        while not receive.poll(0.005):
            if relay_done is None and relay.forwarded - before >= total:
                relay_done = time.monotonic()
            if time.monotonic() > deadline:
                raise SystemExit("the subscriber never finished")
        got, last = receive.recv()
        digest_counts = None
        if digests:
            time.sleep(0.5)  # more than two digest intervals: the last steps' digest goes out
            digest_stop.set()
            digest_counts = digest_receive.recv()
        for p in procs:
            p.join(30)
        forwarded = relay.forwarded - before
        return {**({"digests": digest_counts[0], "steps_in_digests": digest_counts[1]} if digest_counts else {}),
                "messages_per_s": round(got / (last - start)) if got else 0, "received": got, "sent": total,
                "relay_messages_per_s": round(forwarded / ((relay_done or last) - start)),
                "relay_forwarded": forwarded, "relay_dropped": relay.dropped,
                "relay_gaps": relay.gaps, "relay_duplicates": relay.duplicates}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        relay.stop()
        if gate is not None:
            gate.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=100_000, help="per round, over all ranks")
    parser.add_argument("--nodes", type=int, default=2, help="node relays sending (one process each)")
    parser.add_argument("--batch", type=int, default=64, help="messages per ZeroMQ message from a node relay")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (every round's counters too)")
    args = parser.parse_args()
    per_rank = args.messages // (args.nodes * RANKS_PER_NODE)
    arms: dict[str, list[dict]] = {"plain": [], "curve": [], "digests": []}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for arm in arms:
            arms[arm].append(one_round(arm != "plain", args.nodes, per_rank, args.batch, digests=arm == "digests"))
        load.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]['messages_per_s']:,} msg/s"
                                                            for k, v in arms.items()), file=sys.stderr)
    med = {k: statistics.median(x["messages_per_s"] for x in v) for k, v in arms.items()}
    relay_med = {k: statistics.median(x["relay_messages_per_s"] for x in v) for k, v in arms.items()}
    result = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nodes": args.nodes, "ranks_per_node": RANKS_PER_NODE, "batch": args.batch,
        "messages_per_round": args.nodes * RANKS_PER_NODE * per_rank, "rounds": args.rounds,
        "cpus": os.cpu_count(), "load_average_1m": [round(x, 2) for x in load],
        "messages_per_s_median": {k: round(v) for k, v in med.items()},
        "relay_messages_per_s_median": {k: round(v) for k, v in relay_med.items()},
        "received_share_min": {k: round(min(x["received"] / x["sent"] for x in v), 4) for k, v in arms.items()},
        "ratio_curve_over_plain": round(med["curve"] / med["plain"], 4) if med["plain"] else None,
        "ratio_relay_digests_over_curve": round(relay_med["digests"] / relay_med["curve"], 4)
        if relay_med["curve"] else None,
        "per_round": arms,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"median received by the UI: plain {med['plain']:,.0f} msg/s, CURVE {med['curve']:,.0f} msg/s "
              f"(CURVE / plain {result['ratio_curve_over_plain']}); forwarded by the relay: plain "
              f"{relay_med['plain']:,.0f}, CURVE {relay_med['curve']:,.0f}, CURVE with a digest subscriber "
              f"{relay_med['digests']:,.0f} msg/s (digests / CURVE {result['ratio_relay_digests_over_curve']})")


if __name__ == "__main__":
    main()
