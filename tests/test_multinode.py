"""Several nodes: a node relay carries its node's ranks to rank 0's relay (the head), and nothing else.

In one process first (two relays on loopback, real sockets and keys): what a node relay forwards,
what the head lets its key carry, the downlink through it, and losing and finding the head again.
"""

from __future__ import annotations

import time

import pytest
import zmq
from conftest import poll_until

from ringtop.agent.gatekeeper import Gatekeeper, node_user
from ringtop.agent.node_relay import NodeRelay
from ringtop.agent.ports import BindError
from ringtop.agent.relay import Relay
from ringtop.agent.telemetry import Telemetry
from ringtop.protocol import Bye, Hello, Step, curve, decode, encode, free_tcp_port
from ringtop.protocol.curve import secure_client
from ringtop.protocol.downlink import Downlink, decode_downlink, encode_downlink

pytestmark = pytest.mark.timeout(120)

RELAY_PORT = 5556

NODE_RANKS = (2, 3)


def subscriber(address: str, keys) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(sub, keys)
    sub.connect(address)
    return sub


def framed(msg) -> list[bytes]:
    return [f"{msg.__struct_config__.tag}.{msg.rank}".encode(), encode(msg)]


class Head:
    """Rank 0's relay of a 4-rank run on two nodes: ranks 2 and 3 come through node relay 0."""

    def __init__(self, keys, relay_addr: str, publish_addr: str):
        self.gate = Gatekeeper(keys)
        try:
            self.relay = Relay(relay_addr, publish_addr, run_id="run", world_size=4, gate=self.gate,
                               carriers={node_user(0): NODE_RANKS})
        except BindError:
            self.gate.stop()
            raise
        self.gate.start()
        self.relay.start()

    def stop(self) -> None:
        self.relay.stop()
        self.gate.stop()


class Seen:
    """What a UI on the head received, read as it comes."""

    def __init__(self, sock: zmq.Socket):
        self.sock, self.messages = sock, []

    def read(self) -> list:
        while self.sock.poll(0):
            self.messages.append(decode(self.sock.recv_multipart()[-1]))
        return self.messages

    def steps(self, rank: int) -> set[int]:
        return {m.step for m in self.read() if isinstance(m, Step) and m.rank == rank}


@pytest.fixture
def two_nodes():
    """(keys, head, node relay, the node's ranks' Telemetry, downlink frames each rank heard, UI)."""
    keys = curve.generate(world_size=4, node_relays=1)
    relay_addr, publish_addr = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    head = Head(keys, relay_addr, publish_addr)
    events: list[tuple[str, str, dict]] = []
    node = NodeRelay(relay_addr, keys.for_node(0), NODE_RANKS, {r: keys.rank_public[r] for r in NODE_RANKS},
                     run_id="run", world_size=4, on_event=lambda *e: events.append(e))
    node.start()
    heard: dict[int, list] = {r: [] for r in NODE_RANKS}
    ranks = {}
    for r in NODE_RANKS:
        ranks[r] = Telemetry(r, node.address, None, keys=node.client_keys(keys.rank_public[r], keys.rank_secret[r]))
        ranks[r].on_downlink = lambda frame, r=r: heard[r].append(decode_downlink(frame))
    ui = Seen(subscriber(publish_addr, keys.client))
    state = {"head": head}
    try:
        yield keys, state, node, ranks, heard, ui, events, (relay_addr, publish_addr)
    finally:
        for t in ranks.values():
            t.close(timeout_s=2, linger_s=0)
        node.stop()
        ui.sock.close()
        state["head"].stop()


def step_until(ranks: dict[int, Telemetry], ui: Seen, first: int, timeout_s: float = 30) -> int:
    """Every rank emits steps from `first` on until the UI has seen one of each; the last step emitted."""
    step = first
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for t in ranks.values():
            t.emit(Step(step=step, loss=1.0, step_ms=1.0))
        if all(ui.steps(r) & set(range(first, step + 1)) for r in ranks):
            return step
        step += 1
        time.sleep(0.02)
    raise AssertionError(f"no step of every rank from {first} on reached the head: {ui.read()[-5:]}")


def test_a_node_relay_carries_its_ranks_to_the_head_and_the_downlink_back_and_nothing_forged(two_nodes):
    keys, state, node, ranks, heard, ui, events, (relay_addr, _) = two_nodes
    head = state["head"].relay
    for r, t in ranks.items():
        t.emit(Hello(run_id="run", world_size=4, local_rank=r - 2, host="node-b"))
        t.step = 0
    last = step_until(ranks, ui, 0)
    hellos = {m.rank: m for m in ui.read() if isinstance(m, Hello)}
    assert set(hellos) == set(NODE_RANKS) and {h.host for h in hellos.values()} == {"node-b"}

    # The node relay's own key, straight to the head: it may carry ranks 2 and 3, not rank 0 or 1.
    forger = zmq.Context.instance().socket(zmq.PUB)
    forger.setsockopt(zmq.LINGER, 0)
    secure_client(forger, keys.for_node(0))
    forger.connect(relay_addr)
    # Rank 2's key through the node relay, speaking for rank 3 and for rank 0.
    inside = zmq.Context.instance().socket(zmq.PUB)
    inside.setsockopt(zmq.LINGER, 0)
    secure_client(inside, node.client_keys(keys.rank_public[2], keys.rank_secret[2]))
    inside.connect(node.address)
    try:
        forged_bye = Bye(rank=0, reason="forged through the node key", ok=False)
        head_dropped, node_dropped = head.dropped, node.dropped

        def forging():
            forger.send_multipart(framed(forged_bye))
            forger.send_multipart(framed(Hello(run_id="run", world_size=4, rank=1, host="forged")))
            inside.send_multipart(framed(Bye(rank=3, reason="forged by rank 2", ok=False)))
            inside.send_multipart(framed(Step(rank=0, step=99, loss=0.0, step_ms=1.0)))
            return head.dropped >= head_dropped + 2 and node.dropped >= node_dropped + 2
        poll_until(forging, 30, "the forged frames dropped at the head and at the node relay")
        # a real message of the node key's own ranks still passes, straight to the head too
        poll_until(lambda: (forger.send_multipart(framed(Step(rank=2, step=1000, loss=1.0, step_ms=1.0)))
                            or 1000 in ui.steps(2)), 30, "rank 2's step through the node key")
        step_until(ranks, ui, last + 1)
        assert not any(isinstance(m, Bye) or (isinstance(m, Hello) and m.host == "forged")
                       or (isinstance(m, Step) and m.rank in (0, 1)) for m in ui.read()), "nothing forged arrived"
    finally:
        forger.close()
        inside.close()

    state["head"].relay.send_down(encode_downlink(Downlink(action="stacks", id="req-1")))
    poll_until(lambda: all(heard[r] for r in NODE_RANKS), 30, "the downlink on both ranks of the node")
    assert all(heard[r][0] == Downlink(action="stacks", id="req-1") for r in NODE_RANKS)
    assert node.downlinked >= 1 and node.lost == 0 and not events


def test_a_node_relay_that_loses_the_head_says_so_counts_and_resumes_when_it_is_back(two_nodes):
    keys, state, node, ranks, heard, ui, events, (relay_addr, publish_addr) = two_nodes
    for t in ranks.values():
        t.step = 0
    last = step_until(ranks, ui, 0)
    state["head"].stop()
    poll_until(lambda: not node.head_up, 30, "the node relay noticing the head is gone")
    for step in range(last + 1, last + 21):  # training goes on while the head is away: these wait
        for t in ranks.values():
            t.emit(Step(step=step, loss=1.0, step_ms=1.0))
    poll_until(lambda: sum(len(t._queue) for t in ranks.values()) == 0, 30, "the ranks' queues drained")
    ui.sock.close()

    def restarted() -> Head | None:
        try:
            return Head(keys, relay_addr, publish_addr)
        except BindError:  # the old head's ports may take a moment to be free
            return None
    state["head"] = poll_until(restarted, 30, "the head on its old addresses again")
    ui.sock = subscriber(publish_addr, keys.client)
    ui.messages.clear()
    poll_until(lambda: node.head_up, 30, "the node relay finding the head again")
    step_until(ranks, ui, last + 21)
    assert [e[0] for e in events] == ["warn", "info"], events
    lost, resumed = events[0][2], events[1][2]
    assert lost["state"] == "lost" and lost["ranks"] == list(NODE_RANKS)
    assert resumed["state"] == "resumed" and resumed["lost"] == 0 and resumed["down_s"] > 0
    assert node.lost == 0


def test_a_full_queue_while_the_head_is_away_counts_what_it_drops(gatekeeper):
    """Nothing blocks: the oldest messages go, each one counted."""
    gate, keys = gatekeeper
    node = NodeRelay(f"tcp://127.0.0.1:{free_tcp_port()}", keys.for_rank(0), (1,), {1: keys.rank_public[1]},
                     run_id="run", world_size=2, capacity=8)
    node.start()
    rank = Telemetry(1, node.address, None, keys=node.client_keys(keys.rank_public[1], keys.rank_secret[1]))
    try:
        for step in range(30):
            rank.emit(Step(step=step, loss=1.0, step_ms=1.0))
        poll_until(lambda: node.lost == 30 - 8, 30, "22 messages counted as lost")
        assert not node.head_up and node.forwarded == 0
    finally:
        rank.close(timeout_s=2, linger_s=0)
        node.stop()

