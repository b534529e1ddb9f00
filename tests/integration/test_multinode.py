"""Several nodes: a node relay carries its node's ranks to rank 0's relay (the head), and nothing else.

In one process first (two relays on loopback, real sockets and keys): what a node relay forwards,
what the head lets its key carry, the downlink through it, and losing and finding the head again.
Then two real nodes: network namespaces joined by a veth pair (root only), torchrun on each.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import zmq
from background_socket import subscriber
from conftest import TESTS_DIR, agent_env, further, poll_until, stop_process_group

from ringtop.agent.distributed import first_host, slurm_environment
from ringtop.agent.lifecycle import exit_with_parent
from ringtop.agent.transport.gatekeeper import Gatekeeper, node_user
from ringtop.agent.transport.node_relay import NodeRelay
from ringtop.agent.transport.ports import BindError
from ringtop.agent.transport.relay import Relay
from ringtop.agent.transport.telemetry import Telemetry
from ringtop.protocol import Bye, Event, Hello, Step, curve, decode, encode, free_tcp_port, read_log
from ringtop.protocol.batch import encode_batch
from ringtop.protocol.curve import secure_client
from ringtop.protocol.downlink import Downlink, decode_downlink, encode_downlink

pytestmark = pytest.mark.timeout(120)

RELAY_PORT = 5556

more_nodes = further(env="RINGTOP_MULTINODE_ALL")
"""The suite runs one two-node run (static rendezvous) and the in-process relay tests; the other
namespace runs (Slurm's environment, a cut link, a node relay's death, the loopback refusal, c10d)
take a minute more on two cores: `further` variants, which RINGTOP_MULTINODE_ALL=1 runs too."""


NODE_RANKS = (2, 3)


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
        step_until(ranks, ui, last + 1)
        assert not any(isinstance(m, Bye) or (isinstance(m, Hello) and m.host == "forged")
                       or (isinstance(m, Step) and m.rank in (0, 1)) for m in ui.read()), "nothing forged arrived"

        state["head"].relay.send_down(encode_downlink(Downlink(action="stacks", id="req-1")))
        poll_until(lambda: all(heard[r] for r in NODE_RANKS), 30, "the downlink on both ranks of the node")
        assert all(heard[r][0] == Downlink(action="stacks", id="req-1") for r in NODE_RANKS)
        assert node.downlinked >= 1 and node.lost == 0 and not events

        # a message of the node key's own ranks passes, straight to the head too (once: by its seq)
        later = Step(rank=2, step=1000, loss=1.0, step_ms=1.0, seq=10**6)
        poll_until(lambda: forger.send_multipart(framed(later)) or 1000 in ui.steps(2), 30,
                   "rank 2's step through the node key")
        poll_until(lambda: forger.send_multipart(framed(later)) or head.duplicates >= 3, 30, "repeats dropped")
        assert [m for m in ui.read() if isinstance(m, Step) and m.step == 1000] == [later]
    finally:
        forger.close()
        inside.close()


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


def test_a_node_relay_killed_and_started_again_in_its_place_gets_its_ranks_back(two_nodes):
    """The ranks reconnect by themselves; what they sent meanwhile waited in their sockets."""
    keys, state, node, ranks, heard, ui, events, _ = two_nodes
    for t in ranks.values():
        t.step = 0
    last = step_until(ranks, ui, 0)
    node.stop()  # the kill: its sockets close, its ranks' connections drop
    for step in range(last + 1, last + 11):
        for t in ranks.values():
            t.emit(Step(step=step, loss=1.0, step_ms=1.0))

    successor = poll_until(node.successor, 30, "a node relay on the old address (its port free again)")
    successor.start()
    try:
        step_until(ranks, ui, last + 11)
        assert all(set(range(last + 1, last + 11)) <= ui.steps(r) for r in NODE_RANKS), "the steps meanwhile came"
        assert state["head"].relay.gaps == 0 and successor.address == node.address
    finally:
        successor.stop()


def test_the_head_checks_each_message_of_a_batch_and_drops_only_what_is_not_real():
    """A node relay's key sends batches straight to the head: every message in one is checked as if
    it came alone (a forged one dropped and counted, its neighbours forwarded in order), a batch that
    is not one is dropped whole, and a batch sent again is counted as duplicates."""
    keys = curve.generate(world_size=4, node_relays=1)
    relay_addr, publish_addr = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(2))
    head = Head(keys, relay_addr, publish_addr)
    ui = Seen(subscriber(publish_addr, keys.client))
    node = zmq.Context.instance().socket(zmq.PUB)
    node.setsockopt(zmq.LINGER, 0)
    secure_client(node, keys.for_node(0))
    node.connect(relay_addr)
    seqs = itertools.count(1)

    def step(rank: int, seq: int) -> Step:
        return Step(rank=rank, seq=seq, step=seq, loss=1.0, step_ms=1.0)

    def probe() -> bool:  # PUB/SUB drop what precedes the subscriptions: send until one lands
        node.send(encode_batch([framed(step(2, next(seqs)))]))
        return bool(ui.steps(2))
    try:
        poll_until(probe, 30, "a batch through the head to the UI")
        s = next(seqs) + 1_000  # past every probe

        def after_probes() -> list:
            return [m for m in ui.read() if m.seq >= s]
        dropped, duplicates = head.relay.dropped, head.relay.duplicates
        batch = [framed(step(2, s)),
                 framed(step(0, s)),  # a rank the node relay does not carry
                 framed(step(3, s)),
                 [b"step.2", b"\xc1"],  # not a message
                 [b"bye.3", encode(step(3, s + 1))],  # the topic is not its own
                 framed(Hello(run_id="another", world_size=4, rank=3)),
                 framed(step(2, s + 1))]
        node.send(encode_batch(batch))
        poll_until(lambda: step(2, s + 1) in after_probes(), 30, "the batch's last real message at the UI")
        assert after_probes() == [step(2, s), step(3, s), step(2, s + 1)]
        assert head.relay.dropped == dropped + 4
        gaps = head.relay.gaps

        for not_a_batch in ([b"\xc1"], [msgspec.msgpack.encode([b"step.2"])], [msgspec.msgpack.encode([1, 2])],
                            [b"step.2", encode(step(2, s + 2)), b"extra"]):
            node.send_multipart(not_a_batch)
        node.send(encode_batch(batch))  # again, as a node relay that lost the head sends again
        node.send(encode_batch([framed(step(2, s + 3))]))
        poll_until(lambda: step(2, s + 3) in after_probes(), 30, "the batch after the bad ones")
        assert after_probes()[3:] == [step(2, s + 3)]
        assert head.relay.dropped == dropped + 4 + 4 + 4 and head.relay.duplicates == duplicates + 3
        assert head.relay.gaps == gaps + 1 and head.relay.faults.count == 0  # rank 2's s + 2 never came
    finally:
        node.close()
        ui.sock.close()
        head.stop()


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


# ------------------------------------------------------------------ two nodes: network namespaces


def _namespaces_unavailable() -> str:
    """Why two network namespaces cannot be made here ("" when they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root: the test makes two network namespaces joined by a veth pair"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2 / util-linux)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` does not work here"
    return ""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


@dataclass
class Node:
    namespace: str
    interface: str
    address: str
    host: str
    relay_interface: str
    """A second link between the nodes, for telemetry alone: cutting it leaves gloo's traffic alone."""
    relay_address: str


@pytest.fixture
def two_namespaces():
    """Two nodes, `nodea` and `nodeb`: namespaces of this test's own (named after its pid) joined by
    a veth pair, each with its host name's hosts file; removed afterwards, with every process left
    in them, also when the test fails."""
    reason = _namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    pid = os.getpid()
    subnet, relay_subnet = f"10.{200 + pid % 50}.{pid % 250}", f"10.{200 + pid % 50}.{pid % 250 + 1}"
    nodes = [Node(f"rt{side}{pid}", f"rtv{side}{pid}", f"{subnet}.{i + 1}", f"node{side.lower()}",
                  f"rtr{side}{pid}", f"{relay_subnet}.{i + 1}") for i, side in enumerate("AB")]
    hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.host}\n" for n in nodes)
    try:
        for n in nodes:
            _ip("netns", "add", n.namespace)
            Path(f"/etc/netns/{n.namespace}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{n.namespace}/hosts").write_text(hosts)
        _ip("link", "add", nodes[0].interface, "type", "veth", "peer", "name", nodes[1].interface)
        _ip("link", "add", nodes[0].relay_interface, "type", "veth", "peer", "name", nodes[1].relay_interface)
        for n in nodes:
            _ip("-n", n.namespace, "link", "set", "lo", "up")
            for interface, address in ((n.interface, n.address), (n.relay_interface, n.relay_address)):
                _ip("link", "set", interface, "netns", n.namespace)
                _ip("-n", n.namespace, "addr", "add", f"{address}/24", "dev", interface)
                _ip("-n", n.namespace, "link", "set", interface, "up")
        yield nodes
    finally:
        for n in nodes:
            pids = subprocess.run(["ip", "netns", "pids", n.namespace], capture_output=True, text=True).stdout
            for p in pids.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", n.namespace], capture_output=True)  # its veth end goes with it
            shutil.rmtree(f"/etc/netns/{n.namespace}", ignore_errors=True)


def in_namespace(node: Node, argv: list[str], output: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`argv` in `node`'s namespace under its own host name, gloo on its veth end; `env` added."""
    env = {**agent_env(), **(env or {})}
    env["GLOO_SOCKET_IFNAME"] = node.interface
    script = f"hostname {node.host} && exec {shlex.join(argv)}"
    with open(output, "wb") as out:
        return subprocess.Popen(["ip", "netns", "exec", node.namespace, "unshare", "--uts", "sh", "-c", script],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=exit_with_parent)


def outputs(tmp_path: Path) -> str:
    """The tail of every process's output of a two-node run, for a failing assertion's message."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.txt")))


def agent_argv(nodes: list[Node], tmp_path: Path, run_id: str, relay_link: bool = False,
               agent_args: tuple[str, ...] = ()) -> list[str]:
    """The agent's options on every node: telemetry to the head's relay over the veths, logs in
    `tmp_path`, steps until a helper stops the run (or it fails)."""
    relay = nodes[0].relay_address if relay_link else nodes[0].address
    return ["--relay", f"tcp://{relay}:{RELAY_PORT}", "--allow-remote", "--log-dir", str(tmp_path / "logs"),
            "--checkpoint-dir", str(tmp_path / "checkpoints"), "--dist-timeout-s", "60", "--run-id", run_id,
            "--steps", "100000", "--batch-size", "2", "--seq-len", "32", *agent_args]


def torchrun_on(node: Node, k: int, head: Node, run_id: str, rendezvous: str, agent: list[str],
                tmp_path: Path) -> subprocess.Popen:
    """torchrun on node `k` of two, 2 ranks, static rendezvous (--node-rank) or c10d's."""
    if rendezvous == "static":
        meeting = ["--node-rank", str(k), "--master-addr", head.address, "--master-port", "29500"]
    else:
        meeting = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head.address}:29500", "--rdzv-id", run_id,
                   *(["--rdzv-conf", "is_host=1"] if k == 0 else [])]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                *meeting, "-m", "ringtop.agent", *agent]
    return in_namespace(node, launcher, tmp_path / f"{node.host}.txt")


def run_on_two_nodes(nodes: list[Node], tmp_path: Path, during=None, relay_link: bool = False,
                     rendezvous: str = "static", outage: bool = False, agent_args: tuple[str, ...] = ()) -> dict:
    """torchrun on both nodes (2 ranks each, gloo over the veth), the watcher on the head's; what the
    watcher saw. `during(tmp_path)`: run once every rank has stepped, while training goes on
    (the watcher then waits for a node relay's outage and recovery before it stops the run).
    `relay_link`: telemetry on the second link. `rendezvous`: torchrun's static one (--node-rank)
    or c10d's (node A hosts the store: with one host name per namespace, torch cannot tell which), or
    `slurm`: each rank a process of its own with the environment `srun` gives a task. `outage`: the
    watcher waits for a node relay's recovery (it dies by `agent_args`)."""
    head, other = nodes
    run_id = uuid.uuid4().hex[:8]
    agent = agent_argv(nodes, tmp_path, run_id, relay_link, agent_args)
    procs = []

    def output() -> str:
        return outputs(tmp_path)
    try:
        for k, node in enumerate(nodes):
            if rendezvous == "slurm":  # as `srun -N2 --ntasks-per-node 2` starts them: one process per task
                for local in range(2):
                    task = {"SLURM_PROCID": str(2 * k + local), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(k),
                            "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_JOB_ID": str(os.getpid()),
                            "SLURM_STEP_NODELIST": f"{head.host},{other.host}"}
                    procs.append(in_namespace(node, [sys.executable, "-m", "ringtop.agent", *agent],
                                              tmp_path / f"{node.host}-{local}.txt", env=task))
                continue
            procs.append(torchrun_on(node, k, head, run_id, rendezvous, agent, tmp_path))
        seen_path = tmp_path / "seen.json"
        watcher = [sys.executable, str(TESTS_DIR / "helpers" / "multinode_watcher.py"), run_id, "4", str(seen_path)]
        outage = outage or during is not None
        procs.append(in_namespace(head, watcher + (["outage"] if outage else []), tmp_path / "watcher.txt"))
        if during is not None:
            poll_until(lambda: Path(f"{seen_path}.ready").exists() or any(p.poll() is not None for p in procs),
                       180, "every rank stepping", detail=output)
            during(tmp_path)
        for proc in procs:
            try:
                assert proc.wait(240) == 0, output()
            except subprocess.TimeoutExpired:
                raise AssertionError(f"not done within 240 s:\n{output()}") from None
        seen = json.loads(seen_path.read_text())
    finally:
        for proc in procs:
            stop_process_group(proc)
    assert not seen["error"], seen
    hosts = seen["hosts"]  # c10d may order the nodes either way; each node's ranks are consecutive
    assert hosts["0"] == hosts["1"] != hosts["2"] == hosts["3"] and {*hosts.values()} == {"nodea", "nodeb"}, hosts
    assert set(seen["steps"]) == {"0", "1", "2", "3"}, "steps of every rank reached the head's UI"
    assert seen["stacks"] and seen["stacks"].get("answered") == 4, f"the downlink and back: {seen['stacks']}"
    assert seen["stop"] == "done" and seen["byes"] == {"0": True, "1": True, "2": True, "3": True}, seen
    for rank in range(4):  # the ranks' own logs agree on who they are
        hello = read_log(tmp_path / "logs" / f"rank-{rank}.jsonl")[0]
        assert isinstance(hello, Hello) and hello.host == hosts[str(rank)]
    return seen


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rendezvous", ["static", pytest.param("slurm", marks=more_nodes)])
def test_two_nodes_under_torchrun_reach_the_ui_on_the_head_through_a_node_relay(two_namespaces, tmp_path,
                                                                                rendezvous):
    """Static rendezvous and Slurm's environment take different paths into the agent; c10d reaches
    it with the same variables as static."""
    seen = run_on_two_nodes(two_namespaces, tmp_path, rendezvous=rendezvous)
    assert not seen["relay_events"], "the node relay never lost the head"
    assert seen["status"]["lost_messages"] == 0, "no message of any rank was lost on the way"


@pytest.mark.timeout(300)
@more_nodes
def test_two_nodes_under_c10d_rendezvous(two_namespaces, tmp_path):
    seen = run_on_two_nodes(two_namespaces, tmp_path, rendezvous="c10d")
    assert not seen["relay_events"] and seen["status"]["lost_messages"] == 0


def relay_events(log: Path) -> list[Event]:
    return [m for m in read_log(log) if isinstance(m, Event) and m.kind == "relay"] if log.exists() else []


@pytest.mark.timeout(300)
@more_nodes
def test_a_node_relay_cut_off_from_the_head_leaves_training_alone_and_resumes(two_namespaces, tmp_path):
    """The link telemetry takes goes down for a while (gloo's is another): node B's relay loses the
    head, training goes on, forwarding resumes when the link is back."""
    _, other = two_namespaces
    log = tmp_path / "logs" / "rank-2.jsonl"

    def outage(tmp_path: Path) -> None:
        _ip("-n", other.namespace, "link", "set", other.relay_interface, "down")
        try:
            lost = poll_until(lambda: relay_events(log), 60, "rank 2's node relay losing the head")[0]

            def trained_on_for_a_second() -> bool:  # steps go on meanwhile, queued at the node relay
                steps = [m.ts for m in read_log(log) if isinstance(m, Step)]
                return bool(steps) and steps[-1] - lost.ts >= 1.0
            poll_until(trained_on_for_a_second, 60, "rank 2 training on for a second without the head")
        finally:
            _ip("-n", other.namespace, "link", "set", other.relay_interface, "up")
    seen = run_on_two_nodes(two_namespaces, tmp_path, during=outage, relay_link=True)
    states = [e["state"] for e in seen["relay_events"]]
    assert states == ["lost", "resumed"] and {e["rank"] for e in seen["relay_events"]} == {2}, seen["relay_events"]
    resumed = seen["relay_events"][1]
    assert resumed["down_s"] >= 1.0 and resumed["lost"] == 0, resumed
    assert seen["after_resume"] == [0, 1, 2, 3]
    print(f"outage: {resumed}; the head counted {seen['status']['lost_messages']} messages lost")
    assert seen["status"]["lost_messages"] == 0, "what the broken connection swallowed was sent again"
    steps = {r: sorted(s.step for s in read_log(tmp_path / "logs" / f"rank-{r}.jsonl") if isinstance(s, Step))
             for r in range(4)}
    assert all(s == list(range(1, len(s) + 1)) for s in steps.values()), "every rank trained on through the outage"


@pytest.mark.timeout(300)
@more_nodes
def test_a_node_relay_that_dies_is_started_again_in_its_place_and_training_goes_on(two_namespaces, tmp_path):
    seen = run_on_two_nodes(two_namespaces, tmp_path, outage=True, agent_args=("--inject-node-relay-death", "5"))
    assert [(e["rank"], e["state"]) for e in seen["relay_events"]] == [(2, "restarted")], seen["relay_events"]
    assert seen["after_resume"] == [0, 1, 2, 3]
    print(f"node relay restarted; the head counted {seen['status']['lost_messages']} messages lost")
    steps = {r: sorted(s.step for s in read_log(tmp_path / "logs" / f"rank-{r}.jsonl") if isinstance(s, Step))
             for r in range(4)}
    assert all(s == list(range(1, len(s) + 1)) for s in steps.values()), "every rank trained on"


def test_slurm_tasks_get_torchs_variables_and_nothing_else_does():
    task = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_ID": "123456",
            "SLURM_STEP_NODELIST": "gpu[07-09,12],cpu1"}
    assert slurm_environment(task) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07",
                                       "MASTER_PORT": str(20000 + 123456 % 10000)}
    assert slurm_environment({**task, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"})["MASTER_ADDR"] == "10.0.0.5"
    assert slurm_environment({**task, "RANK": "0"}) == {}, "torchrun's own variables win"
    batch_script = {k: v for k, v in task.items() if k != "SLURM_STEP_NUM_TASKS"}
    assert slurm_environment(batch_script) == {}, "a batch script is not a task of a step"
    assert first_host("nodea,nodeb") == "nodea" and first_host("n1") == "n1"


@pytest.mark.timeout(300)
@more_nodes
def test_a_run_on_two_nodes_with_a_loopback_relay_is_refused_on_every_rank_with_the_reason(two_namespaces,
                                                                                           tmp_path):
    head, _ = two_namespaces
    procs = []
    try:
        for k, node in enumerate(two_namespaces):
            launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                        "--node-rank", str(k), "--master-addr", head.address, "--master-port", "29500",
                        "-m", "ringtop.agent", "--steps", "5", "--batch-size", "2", "--seq-len", "32",
                        "--dist-timeout-s", "60", "--checkpoint-dir", str(tmp_path / "checkpoints")]
            procs.append(in_namespace(node, launcher, tmp_path / f"{node.host}.txt"))
        codes = [proc.wait(240) for proc in procs]
    finally:
        for proc in procs:
            stop_process_group(proc)
    outputs = [(tmp_path / f"{node.host}.txt").read_text(errors="replace") for node in two_namespaces]
    assert all(code != 0 for code in codes), outputs
    for output in outputs:
        assert output.count("this run spans 2 nodes") == 2 and "--allow-remote" in output, output[-3000:]


@pytest.mark.timeout(300)
@more_nodes
def test_node_bs_first_rank_killed_is_named_by_its_watcher_and_its_other_rank_still_heard(two_namespaces, tmp_path):
    """Rank 2 starts node B's watcher, which holds the node relay: killed, its death is named from
    outside, and rank 3's last word still reaches the head through that relay (before the
    watcher, the relay died with rank 2 and rank 3's last word stayed in its log). By default
    test_node_watcher.py runs the same path with processes on one host."""
    head, other = two_namespaces
    run_id = uuid.uuid4().hex[:8]
    agent = agent_argv(two_namespaces, tmp_path, run_id)
    procs = [torchrun_on(node, k, head, run_id, "static", agent, tmp_path) for k, node in enumerate(two_namespaces)]
    seen_path = tmp_path / "seen.json"
    watcher = [sys.executable, str(TESTS_DIR / "helpers" / "multinode_watcher.py"), run_id, "4", str(seen_path),
               "death"]
    procs.append(in_namespace(head, watcher, tmp_path / "watcher.txt"))

    def output() -> str:
        return outputs(tmp_path)
    try:
        poll_until(lambda: Path(f"{seen_path}.ready").exists() or procs[-1].poll() is not None, 180,
                   "every rank stepping", detail=output)
        hello = next(m for m in read_log(tmp_path / "logs" / "rank-2.jsonl") if isinstance(m, Hello))
        os.kill(hello.pid, signal.SIGKILL)
        killed_at = time.time()
        assert procs[-1].wait(200) == 0, output()
        seen = json.loads(seen_path.read_text())
    finally:
        for proc in procs:
            stop_process_group(proc)
    assert not seen["error"], seen
    exit_ = seen["exits"]["2"]
    assert exit_["how"] in ("killed by SIGKILL", "died") and str(hello.pid) in exit_["detail"], exit_
    print(f"rank 2 named {exit_['ts'] - killed_at:.2f} s after its SIGKILL: {exit_['how']}; rank 3's end: "
          f"{seen['bye_reasons'].get('3')}")
    assert exit_["ts"] - killed_at < 10, "named within seconds, from outside"
    assert "3" in seen["byes"], "rank 3's last word came through its node's relay, which rank 2 no longer held"
