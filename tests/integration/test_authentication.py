"""Only the run's owner gets in: CURVE on every socket, real runs and real sockets.

A neighbour on the node reaches 127.0.0.1 as easily as the run's owner; what keeps them out is
the keys in the owner's connection file (mode 0600). These tests are that neighbour: no keys,
another run's keys, the server's public key with a key of their own, the client's key where a
rank's belongs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest
import zmq
from conftest import agent_env, poll_until

from ringtop.agent.control.channel import ControlServer
from ringtop.agent.transport.gatekeeper import Gatekeeper
from ringtop.agent.transport.ports import BindError, bind
from ringtop.agent.transport.relay import Relay
from ringtop.cli.ctl import RefusedError, send_command
from ringtop.protocol import Bye, Command, Event, Step, connection_file, curve, decode, encode, free_tcp_port
from ringtop.protocol.curve import ClientKeys, secure_client

pytestmark = pytest.mark.timeout(180)


def stranger_keys(server_public: str) -> ClientKeys:
    """Knows the run's server key (it is public) but no key the run admits."""
    public, secret = zmq.curve_keypair()
    return ClientKeys(server_public=server_public, client_public=public.decode(), client_secret=secret.decode())


def status_command(cmd_id: str) -> bytes:
    return encode(Command(id=cmd_id, cmd="status"))


def dealer(address: str, keys: ClientKeys | None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, keys)
    sock.connect(address)
    return sock


def test_the_gatekeeper_admits_only_the_runs_keys_each_where_it_belongs_and_counts_the_rest():
    keys = curve.generate(world_size=2)
    refusals: list[tuple[str, int]] = []
    gate = Gatekeeper(keys, on_refusal=lambda text, n: refusals.append((text, n)))
    control_addr, relay_addr, publish_addr = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(3))
    server = ControlServer(control_addr, lambda: {"step": 1}, lambda reply: None, gate=gate)
    relay = Relay(relay_addr, publish_addr, run_id="r", world_size=2, gate=gate)
    gate.start()
    server.start()
    relay.start()
    socks = []
    try:
        owner = dealer(control_addr, keys.client)
        socks.append(owner)
        owner.send(status_command("owner"))
        assert owner.poll(10_000), "the run's client key gets an answer"
        assert decode(owner.recv()).id == "owner"

        outsiders = {
            "no keys": None,
            "another run's keys": curve.generate().client,
            "the server key and a key of its own": stranger_keys(keys.server_public),
            "a rank's key on the control socket": keys.for_rank(1),
        }
        def refused_one_more(connect):
            """Each outsider on its own: the gatekeeper's count must rise for it (libzmq's failure
            events for one kind vary with timing, so the reasons are checked only as a set)."""
            before = gate.refused
            connect()
            poll_until(lambda: gate.refused > before, 30, "a refusal")

        for name, outsider_keys in outsiders.items():
            def connect(name=name, outsider_keys=outsider_keys):
                sock = dealer(control_addr, outsider_keys)
                socks.append(sock)
                sock.send(status_command(name))
            refused_one_more(connect)

        def connect_client_key_to_relay():
            client_on_relay = zmq.Context.instance().socket(zmq.PUB)
            client_on_relay.setsockopt(zmq.LINGER, 0)
            secure_client(client_on_relay, keys.client)  # a UI's key cannot publish as a rank
            client_on_relay.connect(relay_addr)
            socks.append(client_on_relay)
        refused_one_more(connect_client_key_to_relay)

        assert set(gate.refused_by_reason) <= {"no keys (an unauthenticated client)", "wrong server key",
                                               "wrong client key", "handshake failed"}, gate.refused_by_reason
        assert "wrong client key" in gate.refused_by_reason, "the ZAP handler's own refusals are named"
        for sock in socks[1:-1]:
            assert not sock.poll(0), "an outsider got an answer"
        assert server.is_alive() and relay.is_alive() and gate.is_alive()
        assert len(refusals) == 1, "the first refusal is reported at once, the rest at most once a minute"
        assert "control socket" in refusals[0][0] or "relay input" in refusals[0][0]

        owner.send(status_command("still"))
        assert owner.poll(10_000) and decode(owner.recv()).id == "still", "the owner is still served"
    finally:
        for sock in socks:
            sock.close()
        server.stop()
        relay.stop()
        gate.stop()


def test_a_neighbour_without_the_keys_can_neither_read_command_nor_publish_into_a_live_run(launch_agents):
    run = launch_agents(2, "--steps", "0", "--batch-size", "4", "--seq-len", "32")
    info = run.connection()
    assert info.keys is not None and not info.insecure
    assert oct(os.stat(connection_file.file_for(run.run_id)).st_mode & 0o777) == "0o600"
    run.wait_for_step(2)
    ctx = zmq.Context.instance()

    with pytest.raises(RefusedError, match="requires its keys"):
        list(send_command(run.control, "stop", {}, timeout_s=5))
    with pytest.raises(RefusedError, match="refused this client's key"):
        list(send_command(run.control, "stop", {}, timeout_s=5, keys=stranger_keys(info.keys.server_public)))

    eavesdropper = ctx.socket(zmq.SUB)
    forger = ctx.socket(zmq.PUB)
    owner = ctx.socket(zmq.SUB)
    for sock in (eavesdropper, forger, owner):
        sock.setsockopt(zmq.LINGER, 0)
    eavesdropper.setsockopt(zmq.SUBSCRIBE, b"")
    eavesdropper.connect(run.publish)
    forger.connect(run.relay)
    owner.setsockopt(zmq.SUBSCRIBE, b"")
    secure_client(owner, info.keys)
    owner.connect(run.publish)
    try:
        forged = [b"bye.1", encode(Bye(rank=1, reason="forged by a neighbour", ok=False))]
        seen = []
        start = max(s.step for s in run.steps(0))

        def trained_on_while_forging():
            forger.send_multipart(forged)
            while owner.poll(0):
                seen.append(decode(owner.recv_multipart()[-1]))
            return any(isinstance(m, Step) and m.rank == 1 and m.step >= start + 3 for m in seen)
        poll_until(trained_on_while_forging, 60, "three more steps of rank 1 on the owner's UI")
        assert not any(isinstance(m, Bye) for m in seen), "the forged bye never reached the owner"
        assert not eavesdropper.poll(0), "the eavesdropper received nothing"
    finally:
        for sock in (eavesdropper, forger, owner):
            sock.close()

    (status,) = list(run.send_command("status", {}))
    assert status.status == "done" and status.result["refused_connections"] >= 3, status.result
    assert list(run.send_command("stop", {}))[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]
    auth_events = [m for m in run.messages(0) if isinstance(m, Event) and m.kind == "auth"]
    assert auth_events and "refused a connection" in auth_events[0].text
    gaps = [b.ts - a.ts for a, b in zip(auth_events, auth_events[1:])]
    assert all(gap >= 59 for gap in gaps), f"refusals are reported at most once a minute: {gaps}"
    assert len(auth_events) < status.result["refused_connections"]
    assert run.output().count("refused") == len(auth_events), "stderr carries the same rate-limited lines"


def ringtop(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", *args], capture_output=True, text=True,
                          env=agent_env(), timeout=timeout_s)


def test_ctl_finds_the_keys_in_the_connection_file_and_refuses_to_guess_without_them(launch_agents, tmp_path):
    run = launch_agents(0, "--steps", "0", "--batch-size", "2", "--seq-len", "16")
    run.connection()

    by_id = ringtop("ctl", "--run", run.run_id, "status")
    assert by_id.returncode == 0 and f"run: {run.run_id}" in by_id.stdout, by_id.stderr

    on_node = ringtop("ctl", "--connect", run.control.replace("127.0.0.1", "localhost"), "status")
    assert on_node.returncode == 0 and f"run: {run.run_id}" in on_node.stdout, "its connection file's keys"
    bare = ringtop("ctl", "--connect", f"tcp://127.0.0.1:{free_tcp_port()}", "status")  # no run of ours has it
    assert bare.returncode == 2 and "--keys FILE" in bare.stderr and "connect-info" in bare.stderr

    info = ringtop("connect-info", run.run_id)  # what a user copies to a laptop for ssh -L
    assert info.returncode == 0
    key_file = tmp_path / "run.json"
    key_file.write_text(info.stdout)
    key_file.chmod(0o600)
    assert msgspec.json.decode(info.stdout)["keys"]["client_secret"]
    with_file = ringtop("ctl", "--keys", str(key_file), "--connect", run.control, "status")
    assert with_file.returncode == 0, with_file.stderr

    wrong = tmp_path / "other.json"
    other = msgspec.json.decode(info.stdout)
    other["keys"] = msgspec.to_builtins(curve.generate().client)
    wrong.write_bytes(msgspec.json.encode(other))
    wrong.chmod(0o600)
    refused = ringtop("ctl", "--keys", str(wrong), "--timeout", "5", "status")
    assert refused.returncode == 4 and "refused" in refused.stderr and "does not match" in refused.stderr

    assert ringtop("ctl", "--run", run.run_id, "stop").returncode == 0
    assert run.wait(60) == 0


def test_an_insecure_run_says_so_loudly_and_plain_clients_reach_it(launch_agents):
    run = launch_agents(0, "--steps", "0", "--batch-size", "2", "--seq-len", "16", "--insecure")
    info = run.connection()
    assert info.insecure and info.keys is None
    plain = list(send_command(run.control, "status", {}, timeout_s=30))
    assert plain[-1].status == "done"
    with pytest.raises(RefusedError, match="--insecure"):  # keys where the run has none
        list(send_command(run.control, "status", {}, timeout_s=5, keys=curve.generate().client))
    listed = ringtop("ls")
    assert run.run_id in listed.stdout and "(insecure)" in listed.stdout
    assert ringtop("ctl", "--connect", run.control, "--insecure", "stop").returncode == 0
    assert run.wait(60) == 0
    assert "WARNING: --insecure" in run.output()
    assert any(isinstance(m, Event) and m.kind == "insecure" for m in run.messages(0))


def test_a_second_run_on_default_ports_moves_to_free_ones_and_both_are_found(launch_agents):
    first = launch_agents(0, "--steps", "0", "--batch-size", "2", "--seq-len", "16", default_ports=True)
    first_info = first.connection()
    second = launch_agents(0, "--steps", "0", "--batch-size", "2", "--seq-len", "16", default_ports=True)
    second_info = second.connection()
    first_ports = {first_info.publish, first_info.relay, first_info.control}
    second_ports = {second_info.publish, second_info.relay, second_info.control}
    assert len(first_ports | second_ports) == 6, (first_ports, second_ports)
    listed = ringtop("ls")
    assert first.run_id in listed.stdout and second.run_id in listed.stdout
    for run in (first, second):
        assert list(run.send_command("stop", {}))[-1].status == "done"
        assert run.wait(60) == 0, run.output()[-2000:]
    assert "is taken" in second.output() or "is taken" in first.output(), "the move is printed"


def test_a_taken_port_moves_only_when_it_was_not_asked_for():
    holder = zmq.Context.instance().socket(zmq.ROUTER)
    holder.setsockopt(zmq.LINGER, 0)
    port = free_tcp_port()
    holder.bind(f"tcp://127.0.0.1:{port}")
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        with pytest.raises(BindError, match="--control"):
            bind(sock, f"tcp://127.0.0.1:{port}", movable=False, what="control", flag="--control")
        moved = bind(sock, f"tcp://127.0.0.1:{port}", movable=True, what="control", flag="--control")
        assert moved.startswith("tcp://127.0.0.1:") and moved != f"tcp://127.0.0.1:{port}"
    finally:
        sock.close()
        holder.close()


def test_a_watched_client_socket_is_freed_when_closed():
    """Every `ringtop ctl` command and UI connection watches its socket's handshakes. libzmq frees
    a monitored socket only once the monitor is off: before, each one kept three descriptors and
    its monitor endpoint (named after a descriptor the next socket reuses), and a process's later
    command failed with "Address already in use". In a process of its own, on the shared context
    as `ringtop ctl` uses it: a socket never freed can also keep that process from ending."""
    code = """
import os, time, zmq
from ringtop.protocol import curve, free_tcp_port
ctx = zmq.Context.instance()  # as `ringtop ctl` does
before = len(os.listdir("/proc/self/fd"))
for _ in range(200):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    watch = curve.HandshakeWatch(sock, has_keys=True)
    sock.connect(f"tcp://127.0.0.1:{free_tcp_port()}")
    watch.close()
    sock.close()
deadline = time.monotonic() + 10
while len(os.listdir("/proc/self/fd")) - before >= 20 and time.monotonic() < deadline:
    time.sleep(0.05)
print(len(os.listdir("/proc/self/fd")) - before, flush=True)
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env=agent_env())
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the sockets were not freed: the context never ended ({exc.stdout!r})") from None
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) < 20, f"{out.stdout.split()[-1]} descriptors more than before"
