"""A node's watcher (agent/watcher/node.py) outside its ranks: it runs the node relay, so the
node's first rank dying leaves the others their way to the head, and it names that death from
outside; the head takes such a word only for a rank the node relay carries. Real processes, real
CURVE sockets on loopback: the head relay in this process, the node watcher a process of its
own, each rank a process (`helpers/fake_node_rank.py`) publishing as a rank does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import msgspec
import pytest
import zmq
from conftest import TESTS_DIR, agent_env, poll_until

from ringtop.agent.transport.gatekeeper import Gatekeeper, node_user
from ringtop.agent.transport.relay import Relay
from ringtop.agent.watcher.link import WatcherLink
from ringtop.agent.watcher.wire import Setup
from ringtop.protocol import RankExit, RankLook, Step, curve, decode, free_tcp_port
from ringtop.protocol.curve import ClientKeys, secure_client

NODE_RANKS = (2, 3)
STUCK_AT = 200
"""Rank 3's last step (20 ms each) before it sleeps holding the GIL: seconds after rank 2's death."""


def _ui(publish: str, keys: curve.RunKeys) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    secure_client(sock, keys.client)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(publish)
    return sock


@pytest.fixture
def head_with_ui():
    """(keys, the head relay's input, the head relay of a 4-rank run whose node relay 0 carries
    NODE_RANKS, a UI subscribed to it)."""
    keys = curve.generate(world_size=4, node_relays=1)
    relay_addr, publish_addr = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    gate = Gatekeeper(keys)
    head = Relay(relay_addr, publish_addr, run_id="run", world_size=4, gate=gate, carriers={node_user(0): NODE_RANKS})
    gate.start()
    head.start()
    ui = _ui(publish_addr, keys)
    try:
        yield keys, relay_addr, head, ui
    finally:
        ui.close()
        head.stop()
        gate.stop()


def _rank(rank: int, address: str, keys: curve.RunKeys, server_public: str, stuck_at: int = 0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(TESTS_DIR / "helpers" / "fake_node_rank.py"), str(rank), "4", "run",
                             address, str(stuck_at)], stdin=subprocess.PIPE, env=agent_env(), start_new_session=True)
    mine = ClientKeys(server_public=server_public, client_public=keys.rank_public[rank],
                      client_secret=keys.rank_secret[rank])
    proc.stdin.write(msgspec.json.encode(mine))
    proc.stdin.close()
    return proc


@pytest.mark.timeout(90)
def test_a_node_watcher_outlives_its_first_rank_names_its_death_and_names_a_stuck_rank_alive(head_with_ui):
    """Rank 2 is killed; rank 3 steps on, then sleeps in libc holding the GIL at step STUCK_AT: the
    head hears rank 2's death, rank 3's steps up to then through the relay rank 2 no longer holds,
    then that rank 3 is stuck, alive."""
    keys, relay_addr, head, ui = head_with_ui
    lost: list[str] = []
    link = WatcherLink.spawn(Setup(role="node", run_id="run", world_size=4, head_relay=relay_addr,
                                   node_keys=keys.for_node(0), ranks=list(NODE_RANKS),
                                   rank_public={r: keys.rank_public[r] for r in NODE_RANKS}),
                             None, None, lost.append)
    ranks = {r: _rank(r, link.address, keys, link.server_public, stuck_at=0 if r == 2 else STUCK_AT)
             for r in NODE_RANKS}
    seen: list = []

    def read() -> list:
        while ui.poll(0):
            seen.append(decode(ui.recv_multipart()[-1]))
        return seen

    def stepping(rank: int, after: float = 0.0) -> bool:
        return any(isinstance(m, Step) and m.rank == rank and m.ts > after for m in read())
    try:
        poll_until(lambda: all(stepping(r) for r in NODE_RANKS), 60, "both ranks' steps through the node watcher")
        os.kill(ranks[2].pid, signal.SIGKILL)  # the node's first rank: the one that started the watcher
        killed_at = time.time()
        exits = poll_until(lambda: [m for m in read() if isinstance(m, RankExit)], 20, "the node watcher's word")
        assert [(e.of_rank, e.pid) for e in exits] == [(2, ranks[2].pid)], exits
        assert exits[0].how in ("killed by SIGKILL", "died") and exits[0].step > 0
        looks = poll_until(lambda: [m for m in read() if isinstance(m, RankLook)], 30,
                           "rank 3, stuck holding the GIL, seen alive by its node's watcher")
        assert looks[0].of_rank == 3 and looks[0].pid == ranks[3].pid, looks[0]
        assert looks[0].words.startswith("stuck (alive, GIL held") and looks[0].silent_s >= 4, looks[0]
        rank3 = [m for m in read() if isinstance(m, Step) and m.rank == 3]
        assert max(m.step for m in rank3) == STUCK_AT, "its steps up to the last came"
        assert any(m.ts > killed_at + 0.5 for m in rank3), "...also after rank 2, whose relay it was, died"
        assert not [m for m in read() if isinstance(m, RankExit) and m.of_rank == 3], "stuck is no death"
        assert head.dropped == 0 and link.proc.poll() is None and not lost
    finally:
        for proc in ranks.values():
            proc.kill()
            proc.wait()
        link.stop(1.0)
    assert link.proc.poll() is not None, "the watcher ended with the run"


@pytest.mark.timeout(60)
def test_the_head_takes_a_node_relays_word_of_an_exit_only_for_a_rank_it_carries(head_with_ui):
    """A node gone bad cannot declare a rank of another node dead."""
    from ringtop.agent.transport.node_relay import NodeRelay

    keys, relay_addr, head, ui = head_with_ui
    node = NodeRelay(relay_addr, keys.for_node(0), NODE_RANKS, {r: keys.rank_public[r] for r in NODE_RANKS},
                     run_id="run", world_size=4)
    node.start()
    try:
        poll_until(lambda: node.head_up, 30, "the node relay reaching the head")
        node.publish_own(RankExit(of_rank=1, how="killed by SIGKILL"))  # rank 1 is the head node's
        node.publish_own(RankExit(of_rank=3, how="killed by SIGKILL"))
        got = poll_until(lambda: ui.poll(100) and decode(ui.recv_multipart()[-1]), 20, "a RankExit at the head")
        assert isinstance(got, RankExit) and got.of_rank == 3, got
        assert head.dropped == 1, "the word about another node's rank was dropped"
    finally:
        node.stop()
